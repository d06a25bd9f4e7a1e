//! Sharding of the metadata table: each index partition has a fixed number of file groups, and a
//! record's file group is a stable hash of its shard key. Stable means fixed forever: every
//! writer and reader, in every version, must place a key in the same file group.

/// FNV-1a, 64 bits: fixed by its definition, unlike the standard library's hashers.
pub fn stable_hash(key: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    key.bytes().fold(OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The shard of `key` among `shards` (at least one).
pub fn shard_of(key: &str, shards: u32) -> u32 {
    (stable_hash(key) % u64::from(shards.max(1))) as u32
}

/// The file id of a shard: `<prefix>-<shard, 4 digits>-0`, as Apache Hudi names its metadata
/// table's file groups (`files`, `col-stats`, `bloom-filters`, `record-index`: a file id holds no
/// `_`, which separates the parts of a file name).
pub fn file_id(index: &str, shard: u32) -> String {
    let prefix = match index {
        "column_stats" => "col-stats".to_string(),
        other => other.replace('_', "-"),
    };
    format!("{prefix}-{shard:04}-0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_hash_is_fnv_1a() {
        // Published FNV-1a 64 test vectors: a change here moves every record of every table.
        assert_eq!(stable_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(stable_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(stable_hash("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(file_id("files", 7), "files-0007-0");
        assert_eq!(file_id("column_stats", 1), "col-stats-0001-0");
        assert_eq!(file_id("record_index", 12), "record-index-0012-0");
    }

    proptest! {
        #[test]
        fn shards_are_in_range_and_spread(keys in proptest::collection::hash_set("[a-z0-9/=_.-]{1,40}", 400..600), shards in 2u32..8) {
            let mut counts = vec![0usize; shards as usize];
            for k in &keys {
                let s = shard_of(k, shards);
                prop_assert!(s < shards);
                prop_assert_eq!(s, shard_of(k, shards));
                counts[s as usize] += 1;
            }
            // No shard empty or holding more than twice its share.
            let share = keys.len() / shards as usize;
            prop_assert!(counts.iter().all(|&c| c > 0 && c < 2 * share + 10), "{counts:?}");
        }
    }
}

//! Hadoop's checksum files beside files on local disk.
//!
//! Apache Hudi's Java engine writes local tables through Hadoop's `LocalFileSystem`, a checksummed
//! file system: beside every file `dir/NAME` it keeps `dir/.NAME.crc` (`crc\0`, the bytes per
//! checksum as a big-endian `i32`, then the CRC-32 of each chunk of that many bytes, big-endian).
//! Java checks a file against it on every read and fails on a mismatch (`ChecksumException`,
//! which `HoodieTableConfig` reports as "Could not load Hoodie properties"), but reads a file
//! with no checksum beside it as it is.
//!
//! So whenever oxlake replaces or deletes a file on local disk it removes the checksum beside
//! it, before the file changes: Java then reads oxlake's bytes unchecked, never against the old
//! file's checksum. Writing a new checksum instead would leave a window between the two files,
//! and two writers replacing the same file (`hoodie.properties`) could leave one's checksum
//! beside the other's bytes; removing it has no such window (see docs/FORMAT.md).

/// The header every Hadoop checksum file starts with.
const MAGIC: &[u8; 4] = b"crc\0";

/// The local path of the checksum Hadoop keeps beside the file at `path`.
pub(super) fn checksum_path(path: &str) -> String {
    match path.rsplit_once('/') {
        Some((dir, name)) => format!("{dir}/.{name}.crc"),
        None => format!(".{path}.crc"),
    }
}

/// Whether `checksum` (a Hadoop checksum file) matches `data`; `None` when it is no checksum file
/// (too short, another header, chunks of no bytes).
pub(super) fn matches(data: &[u8], checksum: &[u8]) -> Option<bool> {
    let header = checksum.get(..8)?;
    if &header[..4] != MAGIC {
        return None;
    }
    let per_chunk = i32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let per_chunk = usize::try_from(per_chunk).ok().filter(|n| *n > 0)?;
    let expected = data.chunks(per_chunk).flat_map(|chunk| crc32fast::hash(chunk).to_be_bytes());
    Some(expected.eq(checksum[8..].iter().copied()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What Hadoop writes for `data` with its default 512 bytes per checksum.
    fn hadoop_checksum(data: &[u8]) -> Vec<u8> {
        let mut out = b"crc\0".to_vec();
        out.extend(512i32.to_be_bytes());
        for chunk in data.chunks(512) {
            out.extend(crc32fast::hash(chunk).to_be_bytes());
        }
        out
    }

    #[test]
    fn a_checksum_matches_the_bytes_it_was_made_of_and_no_others() {
        let data: Vec<u8> = (0..1241u32).map(|i| (i % 251) as u8).collect();
        let sum = hadoop_checksum(&data);
        assert_eq!(sum.len(), 8 + 3 * 4);
        assert_eq!(matches(&data, &sum), Some(true));
        assert_eq!(matches(&data[..1240], &sum), Some(false));
        assert_eq!(matches(&[], &hadoop_checksum(&[])), Some(true));
        assert_eq!(matches(&[], &sum), Some(false));
        assert_eq!(matches(&data, b"crc\0"), None);
        assert_eq!(matches(&data, b"xyz\0\0\0\x02\0"), None);
    }

    #[test]
    fn the_checksum_sits_beside_its_file_with_a_dot() {
        assert_eq!(checksum_path("/t/.hoodie/hoodie.properties"), "/t/.hoodie/.hoodie.properties.crc");
        assert_eq!(checksum_path("x"), ".x.crc");
    }
}

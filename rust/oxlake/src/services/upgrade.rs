//! Upgrading a table of version 6 to version 8 or 9, as Apache Hudi 1.x's upgrade handlers do
//! (`SixToSevenUpgradeHandler`, `SevenToEightUpgradeHandler`): failed writes rolled back first;
//! every instant file of `.hoodie/` moved into `.hoodie/timeline/`, completed ones named
//! `<t>_<completion>.<action>` with the completed file's modification time as completion time,
//! commit metadata (any state of a commit or deltacommit, completed replacecommits) converted
//! from JSON to Avro, pending replacecommits (clusterings) renamed `clustering`; the archived
//! timeline copied into the LSM timeline; then the properties.
//!
//! Unlike Java, which moves file by file, the order keeps every reader working at every point:
//! the new files are written first (a reader of the version 6 table sees none of them), then
//! `hoodie.properties` switches in one put (a reader sees the complete version 8 timeline), then
//! the old files are deleted (layout 2 readers never list them). Killed anywhere, the next
//! `upgrade` finishes: before the switch it writes the new files again, after it deletes what is
//! left. A writer that began on version 6 and commits after the switch fails its commit with a
//! conflict (`Transaction` checks the table version before it completes); one that completed
//! just before the switch is carried over by the upgrade's last look at `.hoodie/`.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use chrono::{DateTime, TimeDelta, Utc};

use crate::commit::HeartbeatWatch;
use crate::config::{TableConfig, keys};
use crate::error::{Error, Result};
use crate::format::commit::CommitMetadata;
use crate::format::instant::{self, Action, Instant, State};
use crate::format::{clean, lsm, rollback};
use crate::table::Table;

/// What an upgrade did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpgradeResult {
    /// The table version before.
    pub from: u32,
    /// The table version after.
    pub to: u32,
    /// Instants moved into the layout 2 timeline.
    pub instants: usize,
    /// Archived instants copied into the LSM timeline.
    pub archived: usize,
}

/// An instant file of the layout 1 timeline.
struct OldFile {
    instant: Instant,
    path: String,
}

impl Table {
    /// Upgrades this table to version `to` (8 or 9); see the module docs. On a table already at
    /// `to`, finishes an upgrade that was killed after the switch.
    pub async fn upgrade(&mut self, to: u32) -> Result<UpgradeResult> {
        if !matches!(to, 8 | 9) {
            return Err(Error::invalid_arg("to", format!("{to}: oxlake upgrades tables to version 8 or 9")));
        }
        self.reload().await?;
        let from = self.config().version;
        if from == to {
            let left = old_files(self).await?;
            for f in &left {
                self.storage().delete(&f.path).await?;
            }
            return Ok(UpgradeResult { from, to, instants: 0, archived: 0 });
        }
        if from != 6 {
            return Err(Error::unsupported(format!("upgrading a table of version {from} to {to} (oxlake upgrades 6)")));
        }
        crate::commit::rollback_failed(self).await?;
        self.reload().await?;
        if let Some(busy) = self.timeline().pending().find(|i| !carried_pending(i.action)) {
            return Err(Error::CommitConflict {
                instant: busy.time.clone(),
                detail: format!("a {} is in progress: upgrade once it ends", busy.action),
            });
        }
        let target = upgraded_config(self, to).await?;
        // The table as it will be: its (empty) timeline names files in the layout 2 folder.
        let mut upgraded = self.clone();
        upgraded.replace_config(target.1.clone());
        let empty = crate::timeline::Timeline::from_file_names([], target.1.timeline_dir(), target.1.layout_version);
        upgraded.set_timeline(empty);
        // 1. The new files, beside the old ones.
        let old = old_files(self).await?;
        let (moved, last) = move_instants(self, &upgraded, &old, None).await?;
        let archived = copy_archive(self, &upgraded).await?;
        crate::commit::failpoint("upgrade-before-switch");
        // 2. The switch.
        self.storage().put(crate::config::PROPERTIES_FILE, Bytes::from(target.0)).await?;
        self.replace_config(target.1);
        crate::commit::failpoint("upgrade-after-switch");
        // 3. Writes that completed on version 6 meanwhile are carried over; then the old files go.
        let carried = carry_late_writes(self, &upgraded, &old, last.as_deref()).await?;
        for f in old_files(self).await? {
            self.storage().delete(&f.path).await?;
        }
        self.reload().await?;
        Ok(UpgradeResult { from, to, instants: moved + carried, archived })
    }
}

/// Pending instants an upgrade carries over as they are (Apache Hudi keeps pending compactions
/// and clusterings; every other pending instant must have ended first).
fn carried_pending(action: Action) -> bool {
    matches!(action, Action::Compaction | Action::LogCompaction | Action::ReplaceCommit | Action::Clustering)
}

/// The instant files of the layout 1 timeline still in `.hoodie/`.
async fn old_files(table: &Table) -> Result<Vec<OldFile>> {
    let listing = table.storage().list_dir(".hoodie").await?;
    Ok(listing
        .into_iter()
        .filter_map(|f| {
            let instant = Instant::parse_file_name(f.path.rsplit('/').next()?, 1)?;
            Some(OldFile { instant, path: f.path })
        })
        .collect())
}

/// The properties text and configuration of the table at version `to`: the merge mode oxlake
/// reads the table with, made explicit (Apache Hudi's handler infers it from the payload class
/// by rules that changed between its releases).
async fn upgraded_config(table: &Table, to: u32) -> Result<(String, TableConfig)> {
    let cfg = table.config();
    let raw = &cfg.raw;
    let version = to.to_string();
    let keygen_type = match cfg.key_generator {
        crate::config::KeyGenerator::Simple => "SIMPLE",
        crate::config::KeyGenerator::Complex => "COMPLEX",
        crate::config::KeyGenerator::NonPartitioned => "NON_PARTITION",
        crate::config::KeyGenerator::Timestamp => "TIMESTAMP",
        crate::config::KeyGenerator::Custom => "CUSTOM",
        crate::config::KeyGenerator::Other(_) => "USER_PROVIDED",
    };
    // Version 8 records a custom key generator's partition types with the fields (Apache Hudi's
    // handler takes them from the writer's options; oxlake has them beside, when it wrote them).
    let typed_fields = (cfg.key_generator == crate::config::KeyGenerator::Custom
        && !cfg.partition_kinds.contains(&crate::config::PartitionKind::Unknown))
    .then(|| {
        let typed = cfg.partition_fields.iter().zip(&cfg.partition_kinds);
        typed
            .map(|(f, k)| {
                format!("{f}:{}", if *k == crate::config::PartitionKind::Timestamp { "TIMESTAMP" } else { "SIMPLE" })
            })
            .collect::<Vec<_>>()
            .join(",")
    });
    let (mode, strategy) = match cfg.merge_mode {
        crate::config::MergeMode::EventTime => ("EVENT_TIME_ORDERING", crate::config::EVENT_TIME_STRATEGY),
        crate::config::MergeMode::CommitTime => ("COMMIT_TIME_ORDERING", crate::config::COMMIT_TIME_STRATEGY),
        crate::config::MergeMode::Custom => ("CUSTOM", "00000000-0000-0000-0000-000000000000"),
    };
    let initial = raw.get(keys::INITIAL_VERSION).cloned().unwrap_or_else(|| cfg.version.to_string());
    let ordering = cfg.ordering_field.clone();
    let mut edits: Vec<(&str, Option<&str>)> = vec![
        (keys::VERSION, Some(&version)),
        (keys::LAYOUT_VERSION, Some("2")),
        (keys::TIMELINE_PATH, Some("timeline")),
        (keys::TIMELINE_HISTORY_PATH, Some("history")),
        (keys::INITIAL_VERSION, Some(&initial)),
        (keys::KEYGEN_TYPE, Some(keygen_type)),
        (keys::MERGE_MODE, Some(mode)),
        (keys::MERGE_STRATEGY_ID, Some(strategy)),
    ];
    if let Some(typed) = &typed_fields {
        edits.push((keys::PARTITION_FIELDS, Some(typed)));
    }
    if to >= 9
        && let Some(o) = &ordering
    {
        edits.push((keys::ORDERING_FIELDS, Some(o)));
    }
    let text = table.storage().get(crate::config::PROPERTIES_FILE).await?;
    crate::config::edit_properties(&crate::config::properties::decode(&text), &edits)
}

/// The completion times of the completed instants of `old`: each completed file's modification
/// time (as Apache Hudi takes it), made later than its requested time and than the completion
/// before it, so that completion order is the order the files were written in.
async fn completion_times(table: &Table, old: &[OldFile], floor: Option<&str>) -> Result<BTreeMap<String, String>> {
    let mut written: Vec<(DateTime<Utc>, String)> = Vec::new();
    for f in old.iter().filter(|f| f.instant.is_completed()) {
        let modified = table.storage().head(&f.path).await?.map(|m| m.last_modified).unwrap_or_else(Utc::now);
        written.push((modified, f.instant.time.clone()));
    }
    written.sort();
    let mut out = BTreeMap::new();
    let mut last: Option<chrono::NaiveDateTime> = floor.map(instant::parse_time).transpose()?;
    for (modified, time) in written {
        let requested = instant::parse_time(&time)?;
        let mut at = modified.naive_utc().max(requested + TimeDelta::milliseconds(1));
        if let Some(l) = last {
            at = at.max(l + TimeDelta::milliseconds(1));
        }
        last = Some(at);
        out.insert(time, at.format("%Y%m%d%H%M%S%3f").to_string());
    }
    Ok(out)
}

/// Writes each of `old` into the layout 2 timeline of `upgraded`, completion times after
/// `floor`; returns how many instants and the latest completion time.
async fn move_instants(
    table: &Table,
    upgraded: &Table,
    old: &[OldFile],
    floor: Option<&str>,
) -> Result<(usize, Option<String>)> {
    let completions = completion_times(table, old, floor).await?;
    let storage = table.storage();
    let mut instants = HashSet::new();
    for f in old {
        let mut instant = f.instant.clone();
        if instant.is_completed() {
            instant.completion = completions.get(&instant.time).cloned();
        } else if instant.action == Action::ReplaceCommit {
            instant.action = Action::Clustering;
        }
        let bytes = storage.get(&f.path).await?;
        let content = convert(&f.path, &f.instant, bytes)?;
        storage.put(&upgraded.timeline().path_of(&instant), content).await?;
        instants.insert(instant.time);
    }
    Ok((instants.len(), completions.values().max().cloned().or(floor.map(str::to_string))))
}

/// An instant file's content on layout 2: commit metadata as Avro (the inflight markers oxlake
/// writes into every inflight file included), everything else as it is.
fn convert(path: &str, instant: &Instant, bytes: Bytes) -> Result<Bytes> {
    let commit_like = matches!(instant.action, Action::Commit | Action::DeltaCommit | Action::Indexing)
        || (instant.action == Action::ReplaceCommit && instant.state != State::Requested)
        || (instant.state == State::Inflight && bytes.first() == Some(&b'{'));
    if !commit_like || crate::format::avro::is_container(&bytes) {
        return Ok(bytes);
    }
    let meta = CommitMetadata::from_json(path, &bytes)?;
    Ok(Bytes::from(meta.to_avro(instant.action == Action::ReplaceCommit && instant.is_completed())?))
}

/// Copies the archived timeline of layout 1 (`.hoodie/archived`) into the LSM timeline of
/// `upgraded`; returns how many instants. The folder itself stays, as Apache Hudi leaves it.
async fn copy_archive(table: &Table, upgraded: &Table) -> Result<usize> {
    let states = crate::table::history::read_archived(table).await?;
    let mut rows = Vec::new();
    for s in states.into_iter().filter(|s| s.instant.is_completed()) {
        let metadata = match (&s.details, s.instant.action) {
            (Some(d), Action::Commit | Action::DeltaCommit | Action::ReplaceCommit) => {
                let meta = CommitMetadata::from_archived(".hoodie/archived", d)?;
                Some(meta.to_avro(s.instant.action == Action::ReplaceCommit)?)
            }
            (Some(d), Action::Clean) => {
                Some(crate::format::avro::write_container(clean::METADATA_SCHEMA, std::slice::from_ref(d))?)
            }
            (Some(d), Action::Rollback) => Some(crate::format::avro::write_container(
                &rollback::ROLLBACK_METADATA_SCHEMA,
                std::slice::from_ref(d),
            )?),
            _ => None,
        };
        rows.push(lsm::LsmInstant {
            completion_time: s.instant.time.clone(),
            instant_time: s.instant.time,
            action: s.instant.action.name().to_string(),
            metadata: metadata.map(Bytes::from),
            plan: None,
        });
    }
    if rows.is_empty() {
        return Ok(0);
    }
    let count = rows.len();
    super::archive::write_history(upgraded, &rows).await?;
    Ok(count)
}

/// After the switch: instants that appeared in `.hoodie/` since `moved` was listed (writers that
/// began on version 6 and passed their version check before the switch). Pending ones are waited
/// for; completed ones are written into the layout 2 timeline. Returns how many.
async fn carry_late_writes(table: &Table, upgraded: &Table, moved: &[OldFile], floor: Option<&str>) -> Result<usize> {
    let known: HashSet<&str> = moved.iter().map(|f| f.path.as_str()).collect();
    let mut watch = HeartbeatWatch::default();
    loop {
        let late: Vec<OldFile> =
            old_files(table).await?.into_iter().filter(|f| !known.contains(f.path.as_str())).collect();
        let pending: Vec<&OldFile> = late
            .iter()
            .filter(|f| !late.iter().any(|o| o.instant.time == f.instant.time && o.instant.is_completed()))
            .collect();
        match pending.first() {
            Some(p) if !crate::commit::is_expired(table, &p.instant).await? => {
                watch.check(table, &p.instant, "the upgrade").await?;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            _ => {
                // Ended (or gone: never completed on either timeline, its files uncommitted).
                let done: Vec<OldFile> = late.into_iter().filter(|f| f.instant.is_completed()).collect();
                return Ok(move_instants(table, upgraded, &done, floor).await?.0);
            }
        }
    }
}

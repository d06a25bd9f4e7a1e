//! Instants: a time, an action and a state, and the file names that encode them.
//!
//! Layout 1 (table version 6) keeps `<t>.<action>[.requested|.inflight]` in `.hoodie/`; layout 2
//! (versions 8 and 9) names completed instants `<requested>_<completed>.<action>` in
//! `.hoodie/timeline/`. A copy-on-write commit is inflight as `<t>.inflight` in both.

use std::cmp::Ordering;
use std::fmt;

use chrono::{NaiveDateTime, TimeDelta, Utc};

use crate::error::{Error, Result};

/// The `yyyyMMddHHmmssSSS` format of instant times.
const TIME_FORMAT: &str = "%Y%m%d%H%M%S%3f";

/// What an instant does to the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// `commit`: a write to a copy-on-write table, or a completed compaction.
    Commit,
    /// `deltacommit`: a write to a merge-on-read table.
    DeltaCommit,
    /// `replacecommit`: a write that replaces file groups (clustering, insert overwrite).
    ReplaceCommit,
    /// `compaction`: a pending compaction; it completes as a `commit`.
    Compaction,
    /// `logcompaction`: a pending log compaction; it completes as a `deltacommit`.
    LogCompaction,
    /// `clustering`: a pending clustering (table version 8 and later); it completes as a `replacecommit`.
    Clustering,
    /// `clean`: deletes file slices no longer retained.
    Clean,
    /// `rollback`: undoes a failed or pending write.
    Rollback,
    /// `savepoint`: pins an instant against cleaning and archiving.
    Savepoint,
    /// `restore`: rolls the table back to a savepoint.
    Restore,
    /// `indexing`: builds a metadata table index.
    Indexing,
}

impl Action {
    /// All actions, for parsing.
    pub const ALL: [Action; 11] = [
        Action::Commit,
        Action::DeltaCommit,
        Action::ReplaceCommit,
        Action::Compaction,
        Action::LogCompaction,
        Action::Clustering,
        Action::Clean,
        Action::Rollback,
        Action::Savepoint,
        Action::Restore,
        Action::Indexing,
    ];

    /// The action's name in file names.
    pub fn name(self) -> &'static str {
        match self {
            Action::Commit => "commit",
            Action::DeltaCommit => "deltacommit",
            Action::ReplaceCommit => "replacecommit",
            Action::Compaction => "compaction",
            Action::LogCompaction => "logcompaction",
            Action::Clustering => "clustering",
            Action::Clean => "clean",
            Action::Rollback => "rollback",
            Action::Savepoint => "savepoint",
            Action::Restore => "restore",
            Action::Indexing => "indexing",
        }
    }

    /// Parses an action name.
    pub fn parse(s: &str) -> Option<Self> {
        Action::ALL.into_iter().find(|a| a.name() == s)
    }

    /// Whether a completed instant of this action changes the data a reader sees.
    pub fn writes_data(self) -> bool {
        matches!(self, Action::Commit | Action::DeltaCommit | Action::ReplaceCommit)
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where an instant is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// Planned: the `.requested` file exists.
    Requested,
    /// Started: the `.inflight` file exists.
    Inflight,
    /// Done: the completed file exists.
    Completed,
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            State::Requested => "requested",
            State::Inflight => "inflight",
            State::Completed => "completed",
        })
    }
}

/// One instant of the timeline.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Instant {
    /// Requested time, `yyyyMMddHHmmssSSS`.
    pub time: String,
    /// What the instant does.
    pub action: Action,
    /// Where the instant is in its life.
    pub state: State,
    /// Completion time (layout 2 completed instants only).
    pub completion: Option<String>,
}

impl Instant {
    /// A new instant in the given state.
    pub fn new(time: impl Into<String>, action: Action, state: State) -> Self {
        Instant { time: time.into(), action, state, completion: None }
    }

    /// Parses a timeline file name; `None` for files that are not instants (`hoodie.properties`,
    /// `.aux`, `*.crc`, unknown actions).
    pub fn parse_file_name(name: &str, layout: u32) -> Option<Self> {
        let (stem, state) = if let Some(s) = name.strip_suffix(".requested") {
            (s, State::Requested)
        } else if let Some(s) = name.strip_suffix(".inflight") {
            (s, State::Inflight)
        } else {
            (name, State::Completed)
        };
        let (times, action) = match stem.split_once('.') {
            Some((t, a)) => (t, Action::parse(a)?),
            // `<t>.inflight`: the copy-on-write commit's inflight file.
            None if state == State::Inflight => (stem, Action::Commit),
            None => return None,
        };
        let (time, completion) = match times.split_once('_') {
            Some((t, c)) if layout >= 2 && state == State::Completed => (t, Some(c.to_string())),
            Some(_) => return None,
            None if layout >= 2 && state == State::Completed => return None,
            None => (times, None),
        };
        if !is_instant_time(time) || completion.as_deref().is_some_and(|c| !is_instant_time(c)) {
            return None;
        }
        Some(Instant { time: time.to_string(), action, state, completion })
    }

    /// The file name of this instant in timeline layout 1.
    pub fn file_name(&self) -> String {
        match (self.state, self.action) {
            (State::Requested, a) => format!("{}.{a}.requested", self.time),
            (State::Inflight, Action::Commit) => format!("{}.inflight", self.time),
            (State::Inflight, a) => format!("{}.{a}.inflight", self.time),
            (State::Completed, a) => format!("{}.{a}", self.time),
        }
    }

    /// The same instant in another state.
    pub fn with_state(&self, state: State) -> Self {
        Instant { state, ..self.clone() }
    }

    /// Whether the instant is completed.
    pub fn is_completed(&self) -> bool {
        self.state == State::Completed
    }
}

impl Ord for Instant {
    fn cmp(&self, other: &Self) -> Ordering {
        (&self.time, self.state, self.action).cmp(&(&other.time, other.state, other.action))
    }
}

impl PartialOrd for Instant {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.time, self.action, self.state)
    }
}

/// Whether `s` is a 17- or 14-digit instant time (or the metadata table's all-zero times).
pub fn is_instant_time(s: &str) -> bool {
    // 20 digits: a 17-digit time with a 3-digit suffix, as Apache Hudi names the metadata table's
    // own instants (ours: its compactions), ordered after the data instant they follow.
    matches!(s.len(), 14 | 17 | 20) && s.bytes().all(|b| b.is_ascii_digit())
}

/// The current UTC time as an instant time.
pub fn now() -> String {
    Utc::now().naive_utc().format(TIME_FORMAT).to_string()
}

/// An instant time strictly after `last` and not before now.
pub fn next_after(last: Option<&str>) -> Result<String> {
    let now = now();
    match last {
        Some(last) if now.as_str() <= last => {
            let parsed = parse_time(last)?;
            Ok((parsed + TimeDelta::milliseconds(1)).format(TIME_FORMAT).to_string())
        }
        _ => Ok(now),
    }
}

/// Parses an instant time (17 or 14 digits).
pub fn parse_time(s: &str) -> Result<NaiveDateTime> {
    let padded = match s.len() {
        14 => format!("{s}000"),
        20 => s[..17].to_string(),
        _ => s.to_string(),
    };
    NaiveDateTime::parse_from_str(&padded, TIME_FORMAT)
        .map_err(|e| Error::invalid_arg("instant", format!("`{s}` is not an instant time: {e}")))
}

/// Normalizes a user-given instant time to 17 digits, accepting 14 digits and separators
/// (`2024-01-02 03:04:05.678`, ISO `T`).
pub fn normalize_time(s: &str) -> Result<String> {
    let digits: String = s.chars().filter(|c| c.is_ascii_digit()).collect();
    let padded = match digits.len() {
        8 => format!("{digits}000000000"),
        14 => format!("{digits}000"),
        17 => digits,
        _ => return Err(Error::invalid_arg("instant", format!("`{s}` is not an instant time"))),
    };
    parse_time(&padded)?;
    Ok(padded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_layout_1_names() {
        let i = Instant::parse_file_name("20240418173551906.commit", 1).unwrap();
        assert_eq!((i.time.as_str(), i.action, i.state), ("20240418173551906", Action::Commit, State::Completed));
        let i = Instant::parse_file_name("20240418173551906.inflight", 1).unwrap();
        assert_eq!((i.action, i.state), (Action::Commit, State::Inflight));
        let i = Instant::parse_file_name("20240418173551906.deltacommit.requested", 1).unwrap();
        assert_eq!((i.action, i.state), (Action::DeltaCommit, State::Requested));
        assert!(Instant::parse_file_name("hoodie.properties", 1).is_none());
        assert!(Instant::parse_file_name("20240418173551906_20240418173552000.commit", 1).is_none());
        assert!(Instant::parse_file_name("20240418173551906.commit.crc", 1).is_none());
    }

    #[test]
    fn parses_layout_2_names() {
        let i = Instant::parse_file_name("20251220210129235_20251220210129883.commit", 2).unwrap();
        assert_eq!(i.completion.as_deref(), Some("20251220210129883"));
        // A completed layout-2 instant without its completion time is not an instant.
        assert!(Instant::parse_file_name("20251220210129235.commit", 2).is_none());
        let i = Instant::parse_file_name("20251220210129235.compaction.requested", 2).unwrap();
        assert_eq!((i.action, i.state, i.completion), (Action::Compaction, State::Requested, None));
    }

    #[test]
    fn next_after_is_strictly_increasing() {
        let far = "99991231235959998";
        assert_eq!(next_after(Some(far)).unwrap(), "99991231235959999");
        assert!(next_after(Some("20240101000059999")).unwrap().as_str() > "20240101000059999");
        assert_eq!(next_after(Some("30000101000059999")).unwrap(), "30000101000100000");
    }

    #[test]
    fn normalizes_user_times() {
        assert_eq!(normalize_time("2024-01-02 03:04:05.678").unwrap(), "20240102030405678");
        assert_eq!(normalize_time("20240102030405").unwrap(), "20240102030405000");
        assert!(normalize_time("yesterday").is_err());
    }

    proptest! {
        #[test]
        fn layout_1_names_round_trip(ms in 0i64..4_000_000_000_000, a in 0usize..11, s in 0usize..3) {
            let time = chrono::DateTime::from_timestamp_millis(ms).unwrap().naive_utc().format(TIME_FORMAT).to_string();
            let state = [State::Requested, State::Inflight, State::Completed][s];
            let i = Instant::new(time, Action::ALL[a], state);
            prop_assert_eq!(Instant::parse_file_name(&i.file_name(), 1), Some(i));
        }
    }
}

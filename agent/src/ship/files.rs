//! Local files: where an interval's profile and its views go, and how they are written. Files
//! appear whole (written aside, synced, then renamed, and the directory synced), so a
//! collector or a person never reads a half-written profile, and a written file survives a
//! crash or power loss. The pipeline writes them; the spool writes its entries the same way.
use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use anyhow::{Context as _, Result};

#[derive(Debug, Clone, Default)]
pub struct FileOutputs {
    pub pprof: Option<PathBuf>,
    pub folded: Option<PathBuf>,
    pub flamegraph: Option<PathBuf>,
}

impl FileOutputs {
    /// The daemon's per-interval file names: <dir>/<kind>-<UTC start>.{pb.gz,folded,svg}.
    pub fn in_dir(dir: &Path, kind: &str, start: SystemTime, flamegraphs: bool) -> FileOutputs {
        let base = dir.join(format!("{kind}-{}", utc_stamp(start)));
        let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
        FileOutputs {
            pprof: Some(with("pb.gz")),
            folded: flamegraphs.then(|| with("folded")),
            flamegraph: flamegraphs.then(|| with("svg")),
        }
    }
}

/// For a recording of several kinds: "out.pb.gz" becomes "out-offcpu.pb.gz", and so on.
pub fn with_kind(path: &Path, kind: &str) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (stem, extension) = match name.find('.') {
        Some(dot) => (&name[..dot], &name[dot..]),
        None => (name.as_str(), ""),
    };
    path.with_file_name(format!("{stem}-{kind}{extension}"))
}

/// Suffix of a file being written: one left behind was interrupted (see `write_atomic`).
pub const PARTIAL: &str = "tmp";

pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = PathBuf::from(format!("{}.{PARTIAL}", path.display()));
    let write = || -> std::io::Result<()> {
        let mut file = fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    // The rename itself is durable only once the directory is.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("syncing directory {}", dir.display()))
}

/// "20261121T054007.123Z": sortable, readable, no dependency on a date crate.
pub fn utc_stamp(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = (since.as_secs() / 86_400, since.as_secs() % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}.{:03}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn utc_stamps_match_known_dates() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000.000Z");
        // 2026-11-21 05:40:07.250 UTC
        let t = UNIX_EPOCH + Duration::from_millis(1_795_239_607_250);
        assert_eq!(utc_stamp(t), "20261121T054007.250Z");
        // Leap day.
        let t = UNIX_EPOCH + Duration::from_secs(1_709_164_800);
        assert_eq!(utc_stamp(t), "20240229T000000.000Z");
    }

    #[test]
    fn kinds_go_before_the_extension() {
        assert_eq!(with_kind(Path::new("/tmp/out.pb.gz"), "offcpu"), PathBuf::from("/tmp/out-offcpu.pb.gz"));
        assert_eq!(with_kind(Path::new("flame"), "wall"), PathBuf::from("flame-wall"));
    }
}

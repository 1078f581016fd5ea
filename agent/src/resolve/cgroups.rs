//! cgroup v2 ids (what the kernel records) to cgroup paths (what people recognise).
use std::{
    collections::HashMap,
    fs,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

/// The cgroup2 mount: /sys/fs/cgroup on unified hosts, /sys/fs/cgroup/unified on hybrid ones.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts.lines().find_map(|line| {
        let mut fields = line.split_ascii_whitespace();
        let (_, path, fstype) = (fields.next()?, fields.next()?, fields.next()?);
        (fstype == "cgroup2").then(|| PathBuf::from(path))
    })
}

/// The id of a cgroup given as a path (absolute, or relative to the cgroup2 mount).
pub fn cgroup_id(path: &str) -> Result<u64> {
    let full = cgroup_dir(path)?;
    let meta = fs::metadata(&full).with_context(|| format!("cgroup {} does not exist", full.display()))?;
    Ok(meta.ino())
}

/// The directory of a cgroup given as a path (absolute, or relative to the cgroup2 mount).
pub fn cgroup_dir(path: &str) -> Result<PathBuf> {
    let Some(root) = cgroup2_mount() else { bail!("no cgroup2 filesystem is mounted: cannot filter by cgroup") };
    Ok(if Path::new(path).starts_with(&root) { PathBuf::from(path) } else { root.join(path.trim_start_matches('/')) })
}

pub struct CgroupNames {
    root: Option<PathBuf>,
    names: HashMap<u64, String>,
    last_scan: Option<Instant>,
}

impl CgroupNames {
    pub fn new() -> Self {
        CgroupNames { root: cgroup2_mount(), names: HashMap::new(), last_scan: None }
    }

    /// Path of the cgroup relative to the cgroup2 root ("/" for the root). cgroups created
    /// after start-up are found by rescanning on a miss, at most once a second.
    pub fn name(&mut self, id: u64) -> String {
        if !self.names.contains_key(&id) && self.last_scan.is_none_or(|t| t.elapsed() > Duration::from_secs(1)) {
            self.scan();
        }
        self.names.get(&id).cloned().unwrap_or_else(|| format!("cgroup-id:{id}"))
    }

    fn scan(&mut self) {
        self.last_scan = Some(Instant::now());
        let Some(root) = self.root.clone() else { return };
        let mut pending = vec![root.clone()];
        while let Some(dir) = pending.pop() {
            let Ok(meta) = fs::metadata(&dir) else { continue };
            let relative = dir.strip_prefix(&root).map(|p| format!("/{}", p.display())).unwrap_or_default();
            self.names.insert(meta.ino(), relative);
            let Ok(entries) = fs::read_dir(&dir) else { continue };
            pending.extend(entries.flatten().filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
        }
    }
}

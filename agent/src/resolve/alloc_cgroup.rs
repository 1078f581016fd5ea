//! The members of the cgroup whose allocators the `alloc` group probes when it is given a
//! cgroup, not pids: read from its `cgroup.procs` a few times a second, so that a process that
//! joins it (started there, forked there, or moved in) is probed soon after, and one that left
//! or ended has its probes taken out.
use std::{collections::HashSet, path::PathBuf, time::Duration};

use super::untrusted::read_proc;

/// How often the members are read: a process that starts in the cgroup allocates unseen for up
/// to this long.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// `cgroup.procs` holds a pid a line: 1 MiB is some 130,000 of them.
const PROCS_CAP: usize = 1 << 20;

pub struct CgroupMembers {
    procs: PathBuf,
    known: HashSet<u32>,
}

impl CgroupMembers {
    /// The members of the cgroup at `dir`, none known yet.
    pub fn new(dir: PathBuf) -> CgroupMembers {
        CgroupMembers { procs: dir.join("cgroup.procs"), known: HashSet::new() }
    }

    /// The processes that joined since the last call, and those that left. A cgroup that
    /// cannot be read (removed) has no members.
    pub fn changes(&mut self) -> (Vec<u32>, Vec<u32>) {
        let now: HashSet<u32> = match read_proc(&self.procs, PROCS_CAP) {
            Ok(text) => text.lines().filter_map(|line| line.trim().parse().ok()).collect(),
            Err(e) => {
                tracing::debug!(cgroup = %self.procs.display(), "the alloc group's cgroup cannot be read: {e}");
                HashSet::new()
            }
        };
        let mut joined: Vec<u32> = now.difference(&self.known).copied().collect();
        let mut left: Vec<u32> = self.known.difference(&now).copied().collect();
        joined.sort_unstable();
        left.sort_unstable();
        self.known = now;
        (joined, left)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_that_join_and_leave_are_told_once() {
        let dir = std::env::temp_dir().join(format!("ember-cgroup-members-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |pids: &str| std::fs::write(dir.join("cgroup.procs"), pids).unwrap();
        let mut members = CgroupMembers::new(dir.clone());
        write("12\n7\n");
        assert_eq!(members.changes(), (vec![7, 12], vec![]));
        assert_eq!(members.changes(), (vec![], vec![]));
        write("7\n30\nnot a pid\n");
        assert_eq!(members.changes(), (vec![30], vec![12]));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(members.changes(), (vec![], vec![7, 30]), "a removed cgroup has no members");
    }
}

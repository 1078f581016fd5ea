//! The processes whose allocators the `alloc` group probes when it is given a cgroup or a pod
//! selector, not pids: the `cgroup.procs` of the cgroup and its descendants (cgroup v2 keeps
//! processes in the leaves: a pod's are in its containers' cgroups), read a few times a second,
//! so that a process that joins (started there, forked there, moved in) is probed soon after,
//! and one that left or ended has its probes taken out. For a selector, the cgroups are those of
//! this node's pods that match it now, found by their uid in kubelet's cgroup names.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::{pods::Pods, targets::from_cgroup_path, untrusted::read_proc};
use crate::pod_selector::PodSelector;

/// How often the members are read: a process that starts in the cgroup allocates unseen for up
/// to this long.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// `cgroup.procs` holds a pid a line: 1 MiB is some 130,000 of them.
const PROCS_CAP: usize = 1 << 20;
/// Cgroups read under one followed cgroup, and how deep: a pod's containers are one level down.
const MAX_CGROUPS: usize = 4096;
const MAX_DEPTH: usize = 8;
/// How often the cgroup tree is searched for selected pods whose cgroups are not found yet (a
/// pod is listed before its containers start), and how much of it.
const SEARCH_EVERY: Duration = Duration::from_secs(1);
const SEARCH_MAX_CGROUPS: usize = 20_000;
const SEARCH_MAX_DEPTH: usize = 6;

pub struct Members {
    followed: Followed,
    known: HashSet<u32>,
}

enum Followed {
    Cgroup(PathBuf),
    Pods(SelectedPods),
}

struct SelectedPods {
    selector: PodSelector,
    pods: Pods,
    /// The cgroup2 root, searched for pod cgroups.
    root: PathBuf,
    /// Selected pod uid -> its cgroup.
    found: HashMap<String, PathBuf>,
    searched: Option<Instant>,
}

impl Members {
    /// The processes in the cgroup at `dir` and below it, none known yet.
    pub fn of_cgroup(dir: PathBuf) -> Members {
        Members { followed: Followed::Cgroup(dir), known: HashSet::new() }
    }

    /// The processes in the cgroups of this node's pods that `selector` selects (in `pods`, the
    /// index the API server's watch keeps), under the cgroup2 root `root`.
    pub fn of_pods(selector: PodSelector, pods: Pods, root: PathBuf) -> Members {
        let selected = SelectedPods { selector, pods, root, found: HashMap::new(), searched: None };
        Members { followed: Followed::Pods(selected), known: HashSet::new() }
    }

    /// The processes that joined since the last call, and those that left. A cgroup that
    /// cannot be read (removed) has no members.
    pub fn changes(&mut self) -> (Vec<u32>, Vec<u32>) {
        let cgroups = match &mut self.followed {
            Followed::Cgroup(dir) => vec![dir.clone()],
            Followed::Pods(selected) => selected.cgroups(),
        };
        let mut now = HashSet::new();
        for cgroup in &cgroups {
            procs_under(cgroup, &mut now);
        }
        let mut joined: Vec<u32> = now.difference(&self.known).copied().collect();
        let mut left: Vec<u32> = self.known.difference(&now).copied().collect();
        joined.sort_unstable();
        left.sort_unstable();
        self.known = now;
        (joined, left)
    }
}

impl SelectedPods {
    /// The cgroups of the pods selected now; searches for those not found yet.
    fn cgroups(&mut self) -> Vec<PathBuf> {
        let selected: HashSet<String> = self.pods.selected(&self.selector).into_iter().collect();
        self.found.retain(|uid, _| selected.contains(uid));
        let missing: HashSet<&String> = selected.iter().filter(|uid| !self.found.contains_key(*uid)).collect();
        if !missing.is_empty() && self.searched.is_none_or(|at| at.elapsed() >= SEARCH_EVERY) {
            self.searched = Some(Instant::now());
            let found = pod_cgroups(&self.root, &missing);
            for (uid, dir) in found {
                tracing::info!(pod_uid = uid, cgroup = %dir.display(), selector = %self.selector, "alloc group: a selected pod's cgroup found");
                self.found.insert(uid, dir);
            }
        }
        self.found.values().cloned().collect()
    }
}

/// Adds the pids in `dir`'s cgroup and its descendants to `pids`, within the bounds.
fn procs_under(dir: &Path, pids: &mut HashSet<u32>) {
    let mut pending = vec![(dir.to_path_buf(), 0)];
    let mut read = 0;
    while let Some((dir, depth)) = pending.pop() {
        read += 1;
        if read > MAX_CGROUPS {
            tracing::debug!(cgroup = %dir.display(), "alloc group: more than {MAX_CGROUPS} cgroups under a followed one; the rest are not read");
            return;
        }
        match read_proc(&dir.join("cgroup.procs"), PROCS_CAP) {
            Ok(text) => pids.extend(text.lines().filter_map(|line| line.trim().parse::<u32>().ok())),
            Err(e) => tracing::debug!(cgroup = %dir.display(), "a followed cgroup cannot be read: {e}"),
        }
        if depth < MAX_DEPTH {
            pending.extend(subdirs(&dir).into_iter().map(|d| (d, depth + 1)));
        }
    }
}

/// The cgroups of the pods in `uids`, searched breadth first under `root` (not below a pod's).
fn pod_cgroups(root: &Path, uids: &HashSet<&String>) -> HashMap<String, PathBuf> {
    let mut found = HashMap::new();
    let mut level = vec![root.to_path_buf()];
    let mut visited = 0;
    for _ in 0..SEARCH_MAX_DEPTH {
        let mut next = Vec::new();
        for dir in level {
            for sub in subdirs(&dir) {
                visited += 1;
                if visited > SEARCH_MAX_CGROUPS {
                    return found;
                }
                let relative = sub.strip_prefix(root).unwrap_or(&sub).to_string_lossy().into_owned();
                match from_cgroup_path(&relative).remove("pod_uid") {
                    Some(uid) if uids.contains(&uid) => {
                        found.insert(uid, sub);
                    }
                    Some(_) => {} // another pod: its containers are not searched
                    None => next.push(sub),
                }
            }
        }
        level = next;
    }
    found
}

/// The directories in `dir` (cgroups), not following links.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.filter_map(Result::ok).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_that_join_and_leave_are_told_once_from_the_cgroup_and_below() {
        let dir = std::env::temp_dir().join(format!("ember-cgroup-members-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("child")).unwrap();
        let write = |pids: &str| std::fs::write(dir.join("cgroup.procs"), pids).unwrap();
        let mut members = Members::of_cgroup(dir.clone());
        write("12\n7\n");
        std::fs::write(dir.join("child/cgroup.procs"), "40\n").unwrap();
        assert_eq!(members.changes(), (vec![7, 12, 40], vec![]));
        assert_eq!(members.changes(), (vec![], vec![]));
        write("7\n30\nnot a pid\n");
        assert_eq!(members.changes(), (vec![30], vec![12]));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(members.changes(), (vec![], vec![7, 30, 40]), "a removed cgroup has no members");
    }

    #[test]
    fn a_pods_cgroup_is_found_by_its_uid_under_kubelets_tree() {
        let root = std::env::temp_dir().join(format!("ember-pod-cgroups-{}", std::process::id()));
        let (uid, other) = ("5e1a0001-0e9f-4a8b-9c7d-000000000001", "5e1a0002-0e9f-4a8b-9c7d-000000000002");
        let pod_dir = |uid: &str| root.join(format!("nested/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice", uid.replace('-', "_")));
        std::fs::create_dir_all(pod_dir(uid).join("cri-containerd-1.scope")).unwrap();
        std::fs::create_dir_all(pod_dir(other)).unwrap();
        let wanted = uid.to_string();
        let found = pod_cgroups(&root, &HashSet::from([&wanted]));
        assert_eq!(found, HashMap::from([(wanted, pod_dir(uid))]));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

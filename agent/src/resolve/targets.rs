//! Targets: who a sample belongs to, read from its cgroup path. systemd names units and
//! slices; container runtimes name their cgroups after the container id (docker, containerd
//! / CRI, cri-o, podman, under the systemd or the cgroupfs driver); kubelet names pod cgroups
//! after the pod's QoS class and uid. Pod metadata from the API server (see `pods`) adds names.
use std::sync::{Arc, LazyLock};

use regex::Regex;

use super::{
    cgroups::CgroupNames,
    pods::Pods,
    relabel::{Labels, Relabeler},
};

/// The labels of each sample's target: its cgroup path, what the path says and what the API
/// server says of its pod, after the relabel rules.
pub struct Targets {
    cgroups: CgroupNames,
    pods: Option<Pods>,
    relabel: Relabeler,
}

impl Targets {
    pub fn new(pods: Option<Pods>, relabel: Relabeler) -> Targets {
        Targets { cgroups: CgroupNames::new(), pods, relabel }
    }

    /// The pod index, when the agent watches this node's pods.
    pub fn pods(&self) -> Option<&Pods> {
        self.pods.as_ref()
    }

    /// The labels of a cgroup, or None when a relabel rule drops it.
    pub fn labels(&mut self, cgroup_id: u64) -> Option<Arc<Labels>> {
        let path = self.cgroups.name(cgroup_id);
        let mut labels = from_cgroup_path(&path);
        labels.insert("cgroup".into(), path);
        if let Some(pods) = &self.pods {
            pods.annotate(&mut labels);
        }
        self.relabel.apply(&mut labels).then(|| Arc::new(labels))
    }
}

/// Container cgroup names: (pattern, runtime). The systemd driver makes `<prefix>-<id>.scope`;
/// the cgroupfs driver makes a directory named after the id under the runtime's parent.
static CONTAINERS: LazyLock<Vec<(Regex, &'static str)>> = LazyLock::new(|| {
    [
        (r"^docker-([0-9a-f]{64})\.scope$", "docker"),
        (r"^cri-containerd-([0-9a-f]{64})\.scope$", "containerd"),
        (r"^crio-([0-9a-f]{64})\.scope$", "cri-o"),
        (r"^libpod-([0-9a-f]{64})\.scope$", "podman"),
    ]
    .into_iter()
    .map(|(pattern, runtime)| (Regex::new(pattern).expect("valid pattern"), runtime))
    .collect()
});
static CGROUPFS_CONTAINER: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})$").expect("valid pattern"));
/// kubepods-<qos>-pod<uid>.slice (systemd driver; the uid's dashes become underscores; kind
/// and nested kubelets prefix it, e.g. kubelet-kubepods-...) or pod<uid> (cgroupfs driver).
static POD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:(?:[a-z]+-)?kubepods(?:-(besteffort|burstable))?-pod([0-9a-f_]{36})\.slice|pod([0-9a-f-]{36}))$").expect("valid pattern")
});

/// The labels of a cgroup path relative to the cgroup2 root (e.g.
/// "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope").
pub fn from_cgroup_path(path: &str) -> Labels {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut labels = Labels::new();
    let mut add = |key: &str, value: &str| {
        labels.insert(key.to_string(), value.to_string());
    };
    if let Some(slice) = parts.iter().rev().find(|p| p.ends_with(".slice")) {
        add("systemd_slice", slice);
    }
    // kubelet's tree may sit under a parent (nested or kind clusters): look for it anywhere.
    let kube = parts.iter().any(|p| *p == "kubepods" || p.ends_with("kubepods.slice"));
    let mut container = None;
    for (i, part) in parts.iter().enumerate() {
        if let Some((runtime, id)) = CONTAINERS.iter().find_map(|(re, runtime)| Some((*runtime, re.captures(part)?.get(1)?.as_str()))) {
            container = Some((id, Some(runtime)));
        } else if let Some(id) = CGROUPFS_CONTAINER.captures(part).and_then(|c| c.get(1)) {
            // cgroupfs driver: /docker/<id>, /kubepods/<qos>/pod<uid>/<id>.
            let runtime = match parts.get(i.wrapping_sub(1)) {
                Some(&"docker") => Some("docker"),
                Some(&"libpod_parent") => Some("podman"),
                _ => None,
            };
            container = Some((id.as_str(), runtime));
        } else if kube {
            if let Some(pod) = POD.captures(part) {
                let uid = pod.get(2).or(pod.get(3)).map_or(String::new(), |m| m.as_str().replace('_', "-"));
                // Guaranteed pods sit right under kubepods; the others under their class.
                let qos = pod.get(1).map(|m| m.as_str()).or_else(|| match parts.get(i.wrapping_sub(1)) {
                    Some(&"burstable") => Some("burstable"),
                    Some(&"besteffort") => Some("besteffort"),
                    _ => None,
                });
                add("pod_uid", &uid);
                add("qos_class", qos.unwrap_or("guaranteed"));
            }
        }
    }
    // The unit that owns the process: a service, or a scope that is not a container's.
    if let Some(unit) = parts.iter().rev().find(|p| p.ends_with(".service") || p.ends_with(".scope")) {
        if container.is_none() {
            add("systemd_unit", unit);
        }
    }
    if let Some((id, runtime)) = container {
        add("container_id", id);
        if let Some(runtime) = runtime {
            add("container_runtime", runtime);
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f6b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b";
    const UID: &str = "0c9f3a8e-5b1d-4c2e-9f7a-6d5e4c3b2a10";

    fn labels(path: &str) -> Labels {
        from_cgroup_path(path)
    }

    fn pairs(expected: &[(&str, &str)]) -> Labels {
        expected.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn kubelet_systemd_driver_names_pod_qos_and_container() {
        let uid_ = UID.replace('-', "_");
        let path = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(
            labels(&path),
            pairs(&[
                ("systemd_slice", &format!("kubepods-burstable-pod{uid_}.slice")),
                ("pod_uid", UID),
                ("qos_class", "burstable"),
                ("container_id", ID),
                ("container_runtime", "containerd"),
            ])
        );
        let guaranteed = format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-{ID}.scope");
        let got = labels(&guaranteed);
        assert!(got["qos_class"] == "guaranteed" && got["container_runtime"] == "cri-o", "{got:?}");
    }

    #[test]
    fn kubelet_cgroupfs_driver_names_pod_qos_and_container() {
        let got = labels(&format!("/kubepods/besteffort/pod{UID}/{ID}"));
        assert_eq!(got, pairs(&[("pod_uid", UID), ("qos_class", "besteffort"), ("container_id", ID)]));
        let got = labels(&format!("/kubepods/pod{UID}/{ID}"));
        assert_eq!(got["qos_class"], "guaranteed", "{got:?}");
        let nested = labels(&format!("/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{}.slice/cri-containerd-{ID}.scope", UID.replace('-', "_")));
        assert!(nested["pod_uid"] == UID && nested["qos_class"] == "besteffort", "{nested:?}");
    }

    #[test]
    fn docker_podman_and_systemd_units() {
        assert_eq!(
            labels(&format!("/system.slice/docker-{ID}.scope")),
            pairs(&[("systemd_slice", "system.slice"), ("container_id", ID), ("container_runtime", "docker")])
        );
        assert_eq!(labels(&format!("/docker/{ID}")), pairs(&[("container_id", ID), ("container_runtime", "docker")]));
        assert_eq!(
            labels(&format!("/machine.slice/libpod-{ID}.scope/container")),
            pairs(&[("systemd_slice", "machine.slice"), ("container_id", ID), ("container_runtime", "podman")])
        );
        assert_eq!(
            labels("/system.slice/nginx.service"),
            pairs(&[("systemd_slice", "system.slice"), ("systemd_unit", "nginx.service")])
        );
        assert_eq!(
            labels("/user.slice/user-1000.slice/session-3.scope"),
            pairs(&[("systemd_slice", "user-1000.slice"), ("systemd_unit", "session-3.scope")])
        );
        assert_eq!(labels("/"), pairs(&[]));
    }
}

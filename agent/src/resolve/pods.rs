//! Pods: Kubernetes metadata for target labels. A watch on the API server, limited to the pods
//! of this node (field selector spec.nodeName), keeps an index from pod uid and container id
//! to pod name, namespace, container name and pod labels. When the API server is away the
//! watch retries with backoff and the index keeps what it knew, so profiling never waits on it.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt as _};

use super::relabel::Labels;
use crate::{ops::metrics, pod_selector::PodSelector};

/// How long a deleted pod's labels stay: samples drained after the pod is gone still name it.
const DELETED_GRACE: Duration = Duration::from_secs(120);

/// Where pod metadata comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The pod's service account (KUBERNETES_SERVICE_HOST and the mounted token).
    InCluster,
    /// An API server URL that needs no credentials, e.g. `kubectl proxy`.
    Url(String),
}

/// Pod labels as `settings` resolved them.
#[derive(Debug, Clone)]
pub struct PodSettings {
    pub source: Source,
    /// Whose pods to watch.
    pub node: String,
    /// Fail when the source is unusable (set explicitly), rather than warn and go on (`auto`).
    pub required: bool,
}

/// Starts the watch on this node's pods. Returns None, with a warning, when the source is
/// unusable and not required.
pub fn start(
    settings: &PodSettings,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Option<(Pods, tokio::task::JoinHandle<Result<()>>)>> {
    let pods = Pods::default();
    match pods.watch(&settings.source, &settings.node, stop) {
        Ok(task) => Ok(Some((pods, task))),
        Err(e) if !settings.required => {
            tracing::warn!("no Kubernetes pod labels: {e:#}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

impl Source {
    fn client(&self) -> Result<kube::Client> {
        let config = match self {
            Source::InCluster => kube::Config::incluster().context("in-cluster Kubernetes config")?,
            Source::Url(url) => {
                let mut config = kube::Config::new(url.parse().with_context(|| format!("Kubernetes API URL {url:?}"))?);
                if url.starts_with("http://") {
                    // No TLS: skip loading the platform's trust store.
                    config.root_cert = Some(vec![]);
                }
                config
            }
        };
        kube::Client::try_from(config).context("Kubernetes client")
    }
}

#[derive(Debug)]
struct PodMeta {
    name: String,
    namespace: String,
    labels: BTreeMap<String, String>,
    /// Container id (without the runtime:// prefix) -> container name.
    containers: HashMap<String, String>,
    deleted: Option<Instant>,
}

#[derive(Debug, Default)]
struct Index {
    pods: HashMap<String, PodMeta>,
    /// Container id -> pod uid.
    containers: HashMap<String, String>,
}

impl Index {
    fn apply(&mut self, pod: &Pod) {
        let Some(uid) = pod.metadata.uid.clone() else { return };
        let status = pod.status.as_ref();
        let statuses = status.into_iter().flat_map(|s| {
            [&s.container_statuses, &s.init_container_statuses, &s.ephemeral_container_statuses].into_iter().flatten().flatten()
        });
        let containers: HashMap<String, String> = statuses
            .filter_map(|c| {
                // "containerd://<id>", "cri-o://<id>", "docker://<id>"
                let id = c.container_id.as_deref()?.rsplit_once("://").map_or(c.container_id.as_deref()?, |(_, id)| id);
                Some((id.to_string(), c.name.clone()))
            })
            .collect();
        self.forget(&uid);
        for id in containers.keys() {
            self.containers.insert(id.clone(), uid.clone());
        }
        let meta = &pod.metadata;
        self.pods.insert(
            uid,
            PodMeta {
                name: meta.name.clone().unwrap_or_default(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                labels: meta.labels.clone().unwrap_or_default(),
                containers,
                deleted: None,
            },
        );
    }

    fn forget(&mut self, uid: &str) {
        if let Some(old) = self.pods.remove(uid) {
            for id in old.containers.keys() {
                self.containers.remove(id);
            }
        }
    }

    fn delete(&mut self, uid: &str, now: Instant) {
        if let Some(pod) = self.pods.get_mut(uid) {
            pod.deleted.get_or_insert(now);
        }
    }

    /// Forgets pods deleted longer ago than the grace period.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<String> =
            self.pods.iter().filter(|(_, p)| p.deleted.is_some_and(|d| now.duration_since(d) > DELETED_GRACE)).map(|(uid, _)| uid.clone()).collect();
        for uid in expired {
            self.forget(&uid);
        }
    }

    fn live(&self) -> usize {
        self.pods.values().filter(|p| p.deleted.is_none()).count()
    }
}

/// The shared index: the watch task writes it, the resolve stage reads it.
#[derive(Debug, Clone, Default)]
pub struct Pods(Arc<RwLock<Index>>);

impl Pods {
    /// Adds `pod`, `namespace`, `container` and `pod_label_<name>` to labels that carry a
    /// `container_id` or `pod_uid` this node's pods have.
    pub fn annotate(&self, labels: &mut Labels) {
        let index = self.0.read().expect("pod index lock");
        let container_id = labels.get("container_id").filter(|id| index.containers.contains_key(*id));
        let Some(uid) = container_id.map(|id| &index.containers[id]).or_else(|| labels.get("pod_uid")) else { return };
        let Some(pod) = index.pods.get(uid) else { return };
        let container = container_id.and_then(|id| pod.containers.get(id)).cloned();
        labels.insert("pod".into(), pod.name.clone());
        labels.insert("namespace".into(), pod.namespace.clone());
        if let Some(name) = container {
            labels.insert("container".into(), name);
        }
        for (key, value) in &pod.labels {
            labels.insert(format!("pod_label_{}", label_name(key)), value.clone());
        }
    }

    /// The uids of this node's pods (not deleted) whose labels `selector` selects.
    pub fn selected(&self, selector: &PodSelector) -> Vec<String> {
        let index = self.0.read().expect("pod index lock");
        index.pods.iter().filter(|(_, pod)| pod.deleted.is_none() && selector.matches(&pod.labels)).map(|(uid, _)| uid.clone()).collect()
    }

    fn update(&self, change: impl FnOnce(&mut Index)) {
        let mut index = self.0.write().expect("pod index lock");
        change(&mut index);
        index.expire(Instant::now());
        metrics::set("ember_kubernetes_pods", &[], index.live() as f64);
    }

    /// Watches this node's pods until `stop` resolves. Errors (API server away, bad
    /// responses) are logged once per outage and retried with backoff.
    pub fn watch(&self, source: &Source, node: &str, stop: impl std::future::Future<Output = ()> + Send + 'static) -> Result<tokio::task::JoinHandle<Result<()>>> {
        let client = source.client()?;
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = watcher(kube::Api::<Pod>::all(client), config).default_backoff().boxed();
        let pods = self.clone();
        tracing::info!(node, source = ?source, "watching this node's pods for Kubernetes labels");
        Ok(tokio::spawn(async move {
            tokio::pin!(stop);
            let (mut listed, mut failing) = (HashSet::new(), false);
            loop {
                let event = tokio::select! {
                    event = events.next() => event,
                    _ = &mut stop => return Ok(()),
                };
                match event {
                    None => return Ok(()),
                    Some(Err(e)) => {
                        metrics::add("ember_kubernetes_watch_errors_total", &[], 1.0);
                        if !failing {
                            tracing::warn!("Kubernetes pod watch failed, retrying; labels stay as they were: {e}");
                        }
                        failing = true;
                    }
                    Some(Ok(event)) => {
                        if std::mem::take(&mut failing) {
                            tracing::info!("Kubernetes pod watch restored");
                        }
                        pods.handle(event, &mut listed);
                    }
                }
            }
        }))
    }

    /// `listed` collects the uids of a (re-)list, so pods that vanished meanwhile are deleted.
    fn handle(&self, event: watcher::Event<Pod>, listed: &mut HashSet<String>) {
        let now = Instant::now();
        match event {
            watcher::Event::Init => listed.clear(),
            watcher::Event::InitApply(pod) => {
                listed.extend(pod.metadata.uid.clone());
                self.update(|index| index.apply(&pod));
            }
            watcher::Event::InitDone => self.update(|index| {
                let gone: Vec<String> = index.pods.keys().filter(|uid| !listed.contains(*uid)).cloned().collect();
                for uid in gone {
                    index.delete(&uid, now);
                }
            }),
            watcher::Event::Apply(pod) => self.update(|index| index.apply(&pod)),
            watcher::Event::Delete(pod) => self.update(|index| index.delete(pod.metadata.uid.as_deref().unwrap_or_default(), now)),
        }
    }
}

/// A Kubernetes label key ("app.kubernetes.io/name") as a label name ("app_kubernetes_io_name").
fn label_name(key: &str) -> String {
    key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

#[cfg(fuzzing)]
impl Pods {
    /// The labels a sample of each container of a pod gets, the pod as the API server sends
    /// it (JSON).
    pub fn labels_from_json(json: &[u8]) -> Vec<Labels> {
        let Ok(pod) = serde_json::from_slice::<Pod>(json) else { return Vec::new() };
        let pods = Pods::default();
        pods.update(|index| index.apply(&pod));
        let containers: Vec<(String, String)> = pods.0.read().expect("pod index lock").containers.clone().into_iter().collect();
        containers
            .into_iter()
            .map(|(id, uid)| {
                let mut labels: Labels = [("container_id".to_string(), id), ("pod_uid".to_string(), uid)].into_iter().collect();
                pods.annotate(&mut labels);
                labels
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, name: &str, containers: &[(&str, &str)]) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"uid": uid, "name": name, "namespace": "prod", "labels": {"app.kubernetes.io/name": "checkout"}},
            "spec": {"containers": containers.iter().map(|(name, _)| serde_json::json!({"name": name})).collect::<Vec<_>>()},
            "status": {"containerStatuses": containers.iter().map(|(name, id)| serde_json::json!({
                "name": name, "containerID": format!("containerd://{id}"), "image": "i", "imageID": "", "ready": true, "restartCount": 0
            })).collect::<Vec<_>>()},
        }))
        .unwrap()
    }

    fn target(pods: &Pods, pairs: &[(&str, &str)]) -> Labels {
        let mut labels: Labels = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        pods.annotate(&mut labels);
        labels
    }

    #[test]
    fn containers_and_pods_are_named_by_id_and_uid() {
        let pods = Pods::default();
        pods.update(|index| index.apply(&pod("u1", "checkout-7f9", &[("web", "c1"), ("sidecar", "c2")])));
        let got = target(&pods, &[("container_id", "c2"), ("pod_uid", "u1")]);
        assert_eq!((got["pod"].as_str(), got["namespace"].as_str(), got["container"].as_str()), ("checkout-7f9", "prod", "sidecar"));
        assert_eq!(got["pod_label_app_kubernetes_io_name"], "checkout");
        // The pod's own cgroup (no container): pod but no container name.
        let got = target(&pods, &[("pod_uid", "u1")]);
        assert!(got["pod"] == "checkout-7f9" && !got.contains_key("container"), "{got:?}");
        assert_eq!(target(&pods, &[("pod_uid", "other")]).len(), 1);
    }

    #[test]
    fn a_selector_selects_live_pods_by_their_labels() {
        let pods = Pods::default();
        pods.update(|index| index.apply(&pod("u1", "checkout-7f9", &[("web", "c1")])));
        let selector = |text| PodSelector::parse(text).unwrap();
        assert_eq!(pods.selected(&selector("app.kubernetes.io/name=checkout")), vec!["u1".to_string()]);
        assert!(pods.selected(&selector("app.kubernetes.io/name!=checkout")).is_empty());
        pods.update(|index| index.delete("u1", Instant::now()));
        assert!(pods.selected(&selector("app.kubernetes.io/name=checkout")).is_empty(), "a deleted pod is not selected");
    }

    #[test]
    fn a_relist_deletes_vanished_pods_after_the_grace_period() {
        let pods = Pods::default();
        let mut listed = HashSet::new();
        pods.handle(watcher::Event::Apply(pod("u1", "a", &[("web", "c1")])), &mut listed);
        pods.handle(watcher::Event::Init, &mut listed);
        pods.handle(watcher::Event::InitApply(pod("u2", "b", &[("web", "c2")])), &mut listed);
        pods.handle(watcher::Event::InitDone, &mut listed);
        // Still named during the grace period, so late samples keep their pod.
        assert_eq!(target(&pods, &[("container_id", "c1")])["pod"], "a");
        assert_eq!(pods.0.read().unwrap().live(), 1);
        let later = Instant::now() + DELETED_GRACE + Duration::from_secs(1);
        pods.0.write().unwrap().expire(later);
        assert!(!target(&pods, &[("container_id", "c1")]).contains_key("pod"));
        assert_eq!(target(&pods, &[("container_id", "c2")])["pod"], "b");
    }
}

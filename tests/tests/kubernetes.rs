//! Kubernetes pod metadata end to end: a stand-in API server on loopback serves this node's
//! pods to the agent's kube client. Fixture processes run in kubelet-style cgroups of those
//! pods; their samples carry pod name, namespace, container name and pod labels. A pod added
//! after start-up is picked up, a keep rule on the namespace restricts profiling to prod, and
//! when the API server goes away the agent keeps profiling with the labels it has. At the
//! collector, a query selects one pod on one node ("pod=checkout-7f9,node=n3"). The `alloc`
//! group given a pod selector probes the processes of the pods it selects, and no others.
use std::{net::SocketAddr, path::Path, process::Command, time::Duration};

use ember_tests::{
    folded_total, http_get,
    kube_api::{pod, FakeApiServer},
    require_root,
    transport::{free_address, stop_agent, CollectorProcess, TestStore},
    wait_for_metric, within, Agent, Decoded, Fixture, TempDir, TestCgroups,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

/// A node of this test run's own, with pods whose uids and container ids no other run shares.
struct TestNode {
    name: String,
    tag: u32,
    salt: u16,
}

impl TestNode {
    /// `salt` keeps each test's pods apart.
    fn new(salt: u16) -> TestNode {
        let tag = std::process::id();
        TestNode { name: format!("node-{tag}"), tag, salt }
    }

    /// Pod `n`'s uid, its container's id, and the kubelet systemd-driver cgroup of that
    /// container in a burstable pod.
    fn pod(&self, n: u32) -> (String, String, String) {
        let uid = format!("{:04x}{n:04x}-0e9f-4a8b-9c7d-{:012x}", self.salt, self.tag);
        let id = format!("{:064x}", (u64::from(self.tag) << 16 | u64::from(self.salt)) * 1_000_003 + u64::from(n));
        let cgroup = format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{id}.scope", uid.replace('-', "_"));
        (uid, id, cgroup)
    }

    /// `ember-agent run` on this node with `config` (which names the API server), writing its
    /// profiles to `local` each second and serving its status on `status`; `args` add to it.
    fn agent(&self, config: &Path, local: &Path, status: SocketAddr, args: &[&str]) -> Agent {
        let mut command = Command::new(ember_tests::agent_bin());
        command.env("NODE_NAME", &self.name).arg("run").arg("--config").arg(config).args(["--interval", "1s", "--output-dir"]).arg(local);
        command.args(["--http", &status.to_string()]).args(args);
        let mut agent = Agent::spawn_command(command);
        agent.wait_ready();
        agent
    }
}

/// Runs the split fixture for `seconds` in cgroup `relative`; returns its pid.
fn run_in(cgroups: &TestCgroups, relative: &str, seconds: f64) -> u32 {
    let mut fixture = Fixture::spawn(FIXTURE, "split", seconds);
    let pid = fixture.pid();
    cgroups.enter(relative, pid);
    fixture.start();
    fixture.finish();
    pid
}

#[test]
fn pod_metadata_labels_samples_new_pods_are_picked_up_and_an_api_outage_keeps_profiling() {
    require_root();
    let dir = TempDir::new("kubernetes");
    let mut cgroups = TestCgroups::new();
    let node = TestNode::new(0x5e1a);
    let (checkout, scratch, worker, elsewhere) = (node.pod(1), node.pod(2), node.pod(3), node.pod(4));
    let labels = [("app", "checkout"), ("app.kubernetes.io/version", "1.2")];
    let mut api = FakeApiServer::start(vec![
        pod(&checkout.0, "checkout-7f9", "prod", &node.name, &labels, &[("web", &checkout.1)]),
        pod(&scratch.0, "scratch", "dev", &node.name, &[], &[("shell", &scratch.1)]),
        // Another node's pod: the field selector keeps it away from this agent.
        pod(&elsewhere.0, "elsewhere", "prod", "another-node", &[], &[("web", &elsewhere.1)]),
    ]);
    let config = dir.path("agent.toml");
    std::fs::write(
        &config,
        format!("kubernetes = \"{}\"\n\n[[relabel]]\naction = \"keep\"\nsource_labels = [\"namespace\"]\nregex = \"prod\"\n", api.url()),
    )
    .unwrap();
    let (local, status) = (dir.path("local"), free_address());
    let (grpc, query) = (free_address(), free_address());
    let collector = CollectorProcess::start_with_http(grpc, query, &TestStore::embedded(&dir), &[]);
    let push = format!("http://{grpc}");
    let agent = node.agent(&config, &local, status, &["-F", "99", "--push", &push, "--spool-dir", dir.path("spool").to_str().unwrap()]);
    wait_for_metric(status, "ember_kubernetes_pods", Duration::from_secs(20), |n| n == 2.0);

    // Cgroups appear after start-up, as a container's do.
    cgroups.create(&checkout.2);
    cgroups.create(&scratch.2);
    let checkout_pid = run_in(&cgroups, &checkout.2, 1.5);
    let scratch_pid = run_in(&cgroups, &scratch.2, 1.0);

    // A pod scheduled after start-up arrives over the watch.
    api.add(pod(&worker.0, "worker-5c2", "prod", &node.name, &[("app", "worker")], &[("queue", &worker.1)]));
    wait_for_metric(status, "ember_kubernetes_pods", Duration::from_secs(20), |n| n == 3.0);
    cgroups.create(&worker.2);
    let worker_pid = run_in(&cgroups, &worker.2, 1.5);

    // The API server goes away: the watch fails and retries; profiling and labels go on.
    api.stop();
    wait_for_metric(status, "ember_kubernetes_watch_errors_total", Duration::from_secs(20), |n| n >= 1.0);
    let after_outage_pid = run_in(&cgroups, &checkout.2, 1.5);
    assert_eq!(http_get(status, "/healthz").0, 200, "the agent must stay healthy while the API server is away");
    std::thread::sleep(Duration::from_millis(1500));
    let stderr = agent.stderr();
    stop_agent(agent);
    drop(cgroups);

    let requests = api.requests();
    let selector = format!("fieldSelector=spec.nodeName%3D{}", node.name);
    assert!(requests.iter().any(|r| r.contains(&selector) && !r.contains("watch=true")), "no list of this node's pods: {requests:?}");
    assert!(requests.iter().any(|r| r.contains(&selector) && r.contains("watch=true")), "no watch of this node's pods: {requests:?}");
    assert!(stderr.contains("Kubernetes pod watch failed"), "the outage must be logged:\n{stderr}");

    let profiles = Decoded::read_kind(&local, "cpu");
    let samples = |pid: u32| profiles.iter().flat_map(|p| p.samples_of(pid)).collect::<Vec<_>>();
    let expect = |pid: u32, pod: &str, container: &str, labels: &[(&str, &str)]| {
        let got = samples(pid);
        assert!(got.len() > 5, "{} samples of {pod}/{container} (pid {pid})", got.len());
        for s in got {
            let label = |k: &str| s.labels.get(k).map(String::as_str);
            assert_eq!((label("pod"), label("namespace"), label("container")), (Some(pod), Some("prod"), Some(container)), "{:?}", s.labels);
            for (k, v) in labels {
                assert_eq!(label(k), Some(*v), "{:?}", s.labels);
            }
        }
    };
    let checkout_labels = [("pod_label_app", "checkout"), ("pod_label_app_kubernetes_io_version", "1.2"), ("qos_class", "burstable")];
    expect(checkout_pid, "checkout-7f9", "web", &checkout_labels);
    expect(worker_pid, "worker-5c2", "queue", &[("pod_label_app", "worker"), ("container_id", worker.1.as_str())]);
    expect(after_outage_pid, "checkout-7f9", "web", &checkout_labels);
    assert!(samples(scratch_pid).is_empty(), "the keep rule on namespace=prod must drop the dev pod's samples");
    let dropped: u64 = profiles.iter().map(|p| p.counter("relabel_dropped")).sum();
    assert!(dropped > 0, "dropped samples are counted");
    assert!(profiles.iter().flat_map(|p| &p.samples).all(|s| s.labels.get("namespace").map(String::as_str) == Some("prod")));

    // The collector slices by the profile's node label and the samples' pod label: exactly
    // the checkout pod's samples, from both its processes.
    let checkout_total: i64 = profiles.iter().map(|p| Decoded::sum(&p.samples_labelled("pod", "checkout-7f9"), 0)).sum();
    let folded = |selector: &str| {
        let (code, body) = http_get(query, &format!("/query?kind=cpu&format=folded&selector={selector}"));
        (code, String::from_utf8(body).unwrap())
    };
    let (code, text) = folded(&format!("pod=checkout-7f9,node={}", node.name));
    assert_eq!(code, 200, "{text}");
    assert_eq!(folded_total(&text), checkout_total, "the collector's pod=checkout-7f9 slice differs from the agent's own files");
    assert!(text.contains("hot_a"), "the fixture's frames must be named:\n{text}");
    let (code, text) = folded("pod=checkout-7f9,node=another-node");
    assert_eq!(code, 404, "another node has no such samples: {text}");
    collector.stop();
}

/// Runs the allocating fixture in cgroup `relative`, once the agent has probed it if it is
/// `selected`, or once it would have if not; returns its pid.
fn allocate_in(cgroups: &TestCgroups, relative: &str, agent: &Agent, selected: bool) -> u32 {
    let mut fixture = Fixture::spawn_with(Command::new(FIXTURE), "alloc", 2.0, &["16"]);
    let pid = fixture.pid();
    cgroups.enter(relative, pid);
    // Selected pods are searched for once a second, and members read ten times a second.
    let limit = Duration::from_secs(if selected { 10 } else { 3 });
    let probed = within(limit, || agent.stderr().contains(&format!("allocator probed pid={pid} ")));
    assert_eq!(probed, selected, "process {pid} in {relative}: probed {probed}\n{}", agent.stderr());
    fixture.start();
    fixture.finish();
    pid
}

#[test]
fn the_alloc_group_probes_the_processes_of_the_pods_a_selector_selects_and_no_others() {
    require_root();
    let dir = TempDir::new("kubernetes-alloc");
    let mut cgroups = TestCgroups::new();
    let node = TestNode::new(0xa110);
    let (checkout, batch, later) = (node.pod(1), node.pod(2), node.pod(3));
    let mut api = FakeApiServer::start(vec![
        pod(&checkout.0, "checkout-7f9", "prod", &node.name, &[("app", "checkout")], &[("web", &checkout.1)]),
        pod(&batch.0, "batch-1", "prod", &node.name, &[("app", "batch")], &[("job", &batch.1)]),
    ]);
    let config = dir.path("agent.toml");
    std::fs::write(&config, format!("kubernetes = \"{}\"\n", api.url())).unwrap();
    let (local, status) = (dir.path("local"), free_address());
    let agent = node.agent(&config, &local, status, &["--events", "alloc", "--alloc-pods", "app=checkout", "--alloc-sample", "64KiB"]);
    wait_for_metric(status, "ember_kubernetes_pods", Duration::from_secs(20), |n| n == 2.0);

    // Containers start after the agent, as they do.
    cgroups.create(&checkout.2);
    cgroups.create(&batch.2);
    let checkout_pid = allocate_in(&cgroups, &checkout.2, &agent, true);
    let batch_pid = allocate_in(&cgroups, &batch.2, &agent, false);
    // A pod scheduled later that the selector selects.
    api.add(pod(&later.0, "checkout-a41", "prod", &node.name, &[("app", "checkout")], &[("web", &later.1)]));
    wait_for_metric(status, "ember_kubernetes_pods", Duration::from_secs(20), |n| n == 3.0);
    cgroups.create(&later.2);
    let later_pid = allocate_in(&cgroups, &later.2, &agent, true);
    std::thread::sleep(Duration::from_millis(1500));
    stop_agent(agent);
    drop(cgroups);
    api.stop();

    let profiles = Decoded::read_kind(&local, "heap");
    let allocated = |pid: u32| profiles.iter().flat_map(|p| p.samples_of(pid)).filter(|s| s.has_function("fixture::alloc_most")).collect::<Vec<_>>();
    for (pid, name) in [(checkout_pid, "checkout-7f9"), (later_pid, "checkout-a41")] {
        let samples = allocated(pid);
        assert!(samples.len() > 5, "{} heap samples of {name}'s alloc_most (pid {pid})", samples.len());
        assert!(samples.iter().all(|s| s.labels.get("pod").map(String::as_str) == Some(name)), "{:?}", samples[0].labels);
    }
    assert!(allocated(batch_pid).is_empty(), "the batch pod, which the selector does not select, was profiled");
}

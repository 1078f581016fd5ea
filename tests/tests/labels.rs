//! Target labels end to end: fixture processes run in cgroups named the way kubelet's systemd
//! driver and docker name theirs; the agent labels their samples with pod uid, QoS class,
//! container id and runtime, applies relabel rules from its config file, and counts what the
//! rules drop. The cgroups are made after the agent starts and removed afterwards. A process
//! moved to another cgroup is labelled with it from the move on.
use std::time::Duration;

use ember_tests::{
    compile_c, held, release, require_root, spin_c, transport::stop_agent, Agent, Decoded, Fixture, TempDir, TestCgroups,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

#[test]
fn samples_carry_pod_qos_container_and_runtime_labels_and_relabel_rules_apply() {
    require_root();
    let dir = TempDir::new("labels");
    let mut cgroups = TestCgroups::new();
    let tag = std::process::id();
    let uid = format!("7d3c2a1b-0e9f-4a8b-9c7d-{tag:012x}");
    let (pod_id, docker_id) = (format!("{:064x}", u64::from(tag) * 7919), format!("{:064x}", u64::from(tag) * 104729));
    let config = dir.path("agent.toml");
    // Keep only this test's targets; name each container runtime://short-id.
    std::fs::write(
        &config,
        format!(
            "[[relabel]]\naction = \"keep\"\nsource_labels = [\"cgroup\"]\nregex = \"{parent}/.*\"\n\n\
             [[relabel]]\naction = \"replace\"\nsource_labels = [\"container_runtime\", \"container_id\"]\n\
             regex = \"(.+);(.{{12}}).*\"\ntarget_label = \"container\"\nreplacement = \"$1://$2\"\n",
            parent = cgroups.parent()
        ),
    )
    .unwrap();
    let local = dir.path("local");
    let mut agent = Agent::spawn(&["run", "--config", config.to_str().unwrap(), "-F", "99", "--interval", "1s", "--output-dir", local.to_str().unwrap()]);
    agent.wait_ready();

    let pod = format!(
        "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{pod_id}.scope",
        uid.replace('-', "_")
    );
    let docker = format!("system.slice/docker-{docker_id}.scope");
    let (pod_path, docker_path) = (cgroups.create(&pod), cgroups.create(&docker));
    let mut in_pod = Fixture::spawn(FIXTURE, "split", 2.0);
    let mut in_docker = Fixture::spawn(FIXTURE, "split", 2.0);
    let (pod_pid, docker_pid) = (in_pod.pid(), in_docker.pid());
    cgroups.enter(&pod, pod_pid);
    cgroups.enter(&docker, docker_pid);
    in_pod.start();
    in_docker.start();
    in_pod.finish();
    in_docker.finish();
    std::thread::sleep(Duration::from_millis(1500));
    stop_agent(agent);
    let parent = cgroups.parent();
    drop(cgroups);

    let profiles = Decoded::read_kind(&local, "cpu");
    let samples = |pid: u32| profiles.iter().flat_map(|p| p.samples_of(pid)).collect::<Vec<_>>();
    let (pod_samples, docker_samples) = (samples(pod_pid), samples(docker_pid));
    assert!(pod_samples.len() > 5 && docker_samples.len() > 5, "{} and {} samples", pod_samples.len(), docker_samples.len());
    for s in &pod_samples {
        let label = |k: &str| s.labels.get(k).map(String::as_str);
        assert_eq!(label("cgroup"), Some(pod_path.as_str()));
        assert_eq!(label("pod_uid"), Some(uid.as_str()));
        assert_eq!(label("qos_class"), Some("burstable"));
        assert_eq!(label("container_id"), Some(pod_id.as_str()));
        assert_eq!(label("container_runtime"), Some("containerd"));
        assert_eq!(label("container"), Some(format!("containerd://{}", &pod_id[..12]).as_str()));
    }
    for s in &docker_samples {
        let label = |k: &str| s.labels.get(k).map(String::as_str);
        assert_eq!(label("cgroup"), Some(docker_path.as_str()));
        assert_eq!(label("container_id"), Some(docker_id.as_str()));
        assert_eq!(label("container_runtime"), Some("docker"));
        assert_eq!(label("systemd_slice"), Some("system.slice"));
        assert_eq!(label("pod_uid"), None);
    }
    // The keep rule dropped everything else on the host, and said how much.
    let parent = format!("{parent}/");
    let strays = profiles.iter().flat_map(|p| &p.samples).filter(|s| !s.labels["cgroup"].starts_with(&parent)).count();
    assert_eq!(strays, 0, "samples outside the kept targets");
    let dropped: u64 = profiles.iter().map(|p| p.counter("relabel_dropped")).sum();
    assert!(dropped > 0, "the agent's own samples must have been dropped by the keep rule, and counted");
}

/// Each CPU keeps a thread's cgroup id from one sample to the next (it lies four pointers
/// away from the task); a move to another cgroup must show in the samples from the move on.
#[test]
fn a_process_moved_to_another_cgroup_is_labelled_with_the_new_one_from_the_move() {
    require_root();
    let dir = TempDir::new("cgroup-move");
    let (source, spin) = (dir.path("spin.c"), dir.path("spin"));
    std::fs::write(&source, spin_c("spin", "")).unwrap();
    compile_c(&source, &spin, &["-O1"]);
    let mut cgroups = TestCgroups::new();
    let (from, to) = (cgroups.create("from"), cgroups.create("to"));
    let mut workload = held(&spin, &["4"]);
    let pid = workload.id();
    cgroups.enter("from", pid);
    let out = dir.path("p.pb.gz");
    let mut agent = Agent::spawn(&["record", "-d", "6s", "-F", "999", "--pid", &pid.to_string(), "-o", out.to_str().unwrap()]);
    agent.wait_ready();
    release(&mut workload);
    std::thread::sleep(Duration::from_secs(2));
    cgroups.enter("to", pid);
    assert!(workload.wait().unwrap().success());
    agent.wait_success(Duration::from_secs(30));

    let profile = Decoded::read(&out);
    let in_cgroup = |cgroup: &str| Decoded::total(&profile.samples_labelled("cgroup", cgroup));
    let (before, after, total) = (in_cgroup(&from), in_cgroup(&to), Decoded::total(&profile.samples_of(pid)));
    println!("{before} samples in {from}, {after} in {to}, of {total}");
    // Two seconds of spinning on each side of the move, at 999 Hz.
    assert!(total >= 1000 && before + after == total, "{before} samples in {from}, {after} in {to}, of {total}");
    assert!(before >= total / 4 && after >= total / 4, "{before} samples in {from} and {after} in {to}: the move shows late or never");
}

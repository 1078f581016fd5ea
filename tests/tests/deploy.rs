//! Deployment: the systemd units verify, the Kubernetes manifests validate against the
//! Kubernetes schemas, and the agent runs with only the capabilities its unit grants, as an
//! unprivileged user, profiling correctly and serving health, readiness and metrics.
use std::{path::Path, process::Command, time::Duration};

use ember_tests::{
    agent_bin, http_get, least_privilege_agent, metric, require_root,
    transport::{collector_bin, free_address, stop_agent},
    wait_for_metric, Agent, Decoded, Fixture, TempDir, DEPLOY,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

#[test]
fn systemd_units_verify() {
    let dir = TempDir::new("units");
    for (unit, installed, built) in [
        ("ember-agent.service", "/usr/local/bin/ember-agent", agent_bin()),
        ("ember-collector.service", "/usr/local/bin/ember-collector", collector_bin()),
    ] {
        // systemd-analyze checks that ExecStart exists: point it at the built binary.
        let text = std::fs::read_to_string(Path::new(DEPLOY).join("systemd").join(unit)).unwrap();
        assert!(text.contains(installed), "{unit} does not run {installed}");
        let copy = dir.path(unit);
        std::fs::write(&copy, text.replace(installed, built.to_str().unwrap())).unwrap();
        let out = Command::new("systemd-analyze").arg("verify").arg(&copy).output().expect("running systemd-analyze");
        let stderr = String::from_utf8_lossy(&out.stderr);
        // Unknown keys are only warnings to systemd: any output is a failure here.
        assert!(out.status.success() && stderr.trim().is_empty(), "{unit}: {stderr}");
    }
}

#[test]
fn kubernetes_manifests_validate_against_the_schemas() {
    let manifests: Vec<_> = std::fs::read_dir(Path::new(DEPLOY).join("kubernetes")).unwrap().flatten().map(|e| e.path()).collect();
    assert!(manifests.len() >= 5, "{manifests:?}");
    for version in ["1.30.0", "1.37.0"] {
        let out = Command::new("python3")
            .args(["-m", "kubernetes_validate", "--strict", "--quiet", "-k", version])
            .args(&manifests)
            .output()
            .expect("running kubernetes-validate (installed by `cargo xtask setup`)");
        assert!(out.status.success(), "Kubernetes {version}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn agent_with_only_the_units_capabilities_profiles_and_serves_health_and_metrics() {
    require_root();
    let dir = TempDir::new("least-privilege");
    // The unprivileged user writes here.
    std::fs::set_permissions(&dir.0, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let (status, collector) = (free_address(), free_address());
    let (local, spool) = (dir.path("local"), dir.path("spool"));
    let mut fixture = Fixture::spawn(FIXTURE, "split", 2.0);
    let pid = fixture.pid();
    let mut command = least_privilege_agent();
    command
        .args(["run", "--config", &format!("{DEPLOY}/agent.toml"), "-F", "99", "--interval", "1s"])
        .args(["--push", &format!("http://{collector}"), "--spool-dir", spool.to_str().unwrap()])
        .args(["--output-dir", local.to_str().unwrap(), "--http", &status.to_string()]);
    let mut agent = Agent::spawn_command(command);
    agent.wait_ready();
    assert_eq!(http_get(status, "/readyz"), (200, b"ok\n".to_vec()));
    fixture.start();
    // The fill ratio is that of the last drain: read it while the fixture still samples.
    std::thread::sleep(Duration::from_millis(1300));
    let (_, body) = http_get(status, "/metrics");
    let busy = String::from_utf8(body).unwrap();
    assert!(metric(&busy, "ember_map_fill_ratio{map=\"counts\"}") > 0.0, "{busy}");
    fixture.finish();
    // The fixture's profiles, symbolized and waiting in the spool (a loaded host delays them).
    wait_for_metric(status, "ember_symbol_cache_misses_total", Duration::from_secs(20), |misses| misses > 0.0);
    wait_for_metric(status, "ember_spool_profiles{sink=\"collector\"}", Duration::from_secs(20), |profiles| profiles >= 2.0);
    assert_eq!(http_get(status, "/healthz"), (200, b"ok\n".to_vec()));
    let (code, body) = http_get(status, "/metrics");
    let metrics = String::from_utf8(body).unwrap();
    assert_eq!(code, 200);
    assert!(metric(&metrics, "ember_samples_total") > 100.0);
    assert!(metric(&metrics, "ember_intervals_total") >= 2.0);
    assert_eq!(metric(&metrics, "ember_lost_total{reason=\"map_full\"}"), 0.0);
    assert_eq!(metric(&metrics, "ember_map_capacity{map=\"counts\"}"), 10240.0);
    assert!(metric(&metrics, "ember_processes_tracked") >= 1.0);
    assert!(metric(&metrics, "ember_symbol_cache_misses_total") > 0.0);
    // No collector listens: profiles wait in the spool, and the failures are counted.
    assert!(metric(&metrics, "ember_spool_profiles{sink=\"collector\"}") >= 2.0);
    assert!(metric(&metrics, "ember_ship_failures_total{sink=\"collector\"}") >= 1.0);
    stop_agent(agent);

    // The deploy config's relabel rule and the fixture's named frames, under least privilege.
    let profiles = Decoded::read_kind(&local, "cpu");
    let samples: Vec<_> = profiles.iter().flat_map(|p| p.samples_of(pid)).collect();
    assert!(Decoded::total(&samples) > 50, "{} fixture samples", Decoded::total(&samples));
    assert!(samples.iter().any(|s| s.has_function("fixture::hot_a")), "the fixture's frames are not named");
}

//! OTLP export end to end on loopback: the agent exports to a real OTLP profiles receiver
//! (tonic, the opentelemetry-proto service) that starts only after the agent, so the first
//! profiles wait in the spool. Every exported profile must carry the same stacks and totals
//! as the pprof files the agent writes beside it.
use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use ember_tests::{
    require_root,
    transport::{free_address, spool_is_empty, stop_agent},
    Agent, Decoded, Fixture, TempDir,
};
use opentelemetry_proto::tonic::{
    collector::profiles::v1development::{
        profiles_service_server::{ProfilesService, ProfilesServiceServer},
        ExportProfilesServiceRequest, ExportProfilesServiceResponse,
    },
    common::v1::any_value::Value,
};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");

#[derive(Clone, Default)]
struct Receiver {
    requests: Arc<Mutex<Vec<(ExportProfilesServiceRequest, Option<String>)>>>,
}

#[tonic::async_trait]
impl ProfilesService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportProfilesServiceRequest>,
    ) -> Result<tonic::Response<ExportProfilesServiceResponse>, tonic::Status> {
        let tenant = request.metadata().get("x-scope-orgid").and_then(|v| v.to_str().ok()).map(str::to_string);
        self.requests.lock().unwrap().push((request.into_inner(), tenant));
        Ok(tonic::Response::new(ExportProfilesServiceResponse { partial_success: None }))
    }
}

/// "leaf-last;folded" stacks of the fixture's process with their CPU sample counts, from
/// every OTLP profile of sample type "samples".
fn otlp_folded(requests: &[(ExportProfilesServiceRequest, Option<String>)], pid: i64) -> (BTreeMap<String, i64>, usize) {
    let mut folded = BTreeMap::new();
    let mut profiles = 0;
    for (request, _) in requests {
        let d = request.dictionary.as_ref().expect("a dictionary");
        assert_eq!(d.string_table[0], "", "string 0 must be empty");
        let text = |i: i32| d.string_table[i as usize].as_str();
        for resource in &request.resource_profiles {
            for profile in resource.scope_profiles.iter().flat_map(|s| &s.profiles) {
                let sample_type = profile.sample_type.as_ref().unwrap();
                if text(sample_type.type_strindex) != "samples" {
                    continue;
                }
                profiles += 1;
                for sample in &profile.samples {
                    let of_pid = sample.attribute_indices.iter().any(|&a| {
                        let attribute = &d.attribute_table[a as usize];
                        text(attribute.key_strindex) == "pid"
                            && attribute.value.as_ref().and_then(|v| v.value.as_ref()) == Some(&Value::IntValue(pid))
                    });
                    if !of_pid {
                        continue;
                    }
                    let stack = &d.stack_table[sample.stack_index as usize];
                    let frames: Vec<&str> = stack
                        .location_indices
                        .iter()
                        .rev()
                        .flat_map(|&l| d.location_table[l as usize].lines.iter().rev())
                        .map(|line| text(d.function_table[line.function_index as usize].name_strindex))
                        .collect();
                    *folded.entry(frames.join(";")).or_default() += sample.values[0];
                }
            }
        }
    }
    (folded, profiles)
}

/// The same from the agent's pprof files.
fn pprof_folded(dir: &std::path::Path, pid: u32) -> (BTreeMap<String, i64>, usize) {
    let mut folded = BTreeMap::new();
    let profiles = Decoded::read_kind(dir, "cpu");
    for profile in &profiles {
        for sample in profile.samples_of(pid) {
            let frames: Vec<&str> = sample.frames.iter().rev().map(|f| f.function.as_str()).collect();
            *folded.entry(frames.join(";")).or_default() += sample.values[0];
        }
    }
    (folded, profiles.len())
}

#[test]
fn profiles_exported_over_otlp_match_the_agents_pprof_and_survive_a_late_receiver() {
    require_root();
    let dir = TempDir::new("otlp");
    let (address, local, spool) = (free_address(), dir.path("local"), dir.path("spool"));
    let mut fixture = Fixture::spawn(FIXTURE, "split", 4.0);
    let pid = fixture.pid();
    let url = format!("http://{address}");
    let mut agent = Agent::spawn(&[
        "run", "-F", "99", "--interval", "1s", "--otlp", &url, "--otlp-header", "X-Scope-OrgID=team-a", "--pid",
        &pid.to_string(), "--output-dir", local.to_str().unwrap(), "--spool-dir", spool.to_str().unwrap(),
    ]);
    agent.wait_ready();
    fixture.start();
    // The receiver is down for the first seconds: those profiles wait in the OTLP spool.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!spool_is_empty(&spool.join("otlp")), "nothing spooled while the receiver was down");
    let receiver = Receiver::default();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let server = tonic::transport::Server::builder().add_service(ProfilesServiceServer::new(receiver.clone())).serve(address);
    let server = runtime.spawn(server);
    fixture.finish();
    std::thread::sleep(Duration::from_secs(2));
    stop_agent(agent);
    server.abort();
    assert!(spool_is_empty(&spool.join("otlp")), "profiles left in the OTLP spool with the receiver up");

    let requests = receiver.requests.lock().unwrap();
    assert!(requests.iter().all(|(_, tenant)| tenant.as_deref() == Some("team-a")), "the configured header is missing");
    let (exported, exported_profiles) = otlp_folded(&requests, i64::from(pid));
    let (written, written_profiles) = pprof_folded(&local, pid);
    assert_eq!(exported_profiles, written_profiles, "every interval exported exactly once");
    assert!(written.values().sum::<i64>() > 100, "the fixture was barely sampled: {} samples", written.values().sum::<i64>());
    // Compared whole (stacks are long): a difference names the first stack that differs.
    let first_difference = exported.iter().zip(&written).find(|(a, b)| a != b);
    assert!(exported.len() == written.len() && first_difference.is_none(), "OTLP and pprof differ: {first_difference:?}");
    assert!(exported.keys().any(|stack| stack.contains("fixture::main;fixture::hot_a")), "no hot_a among {} stacks", exported.len());
    // Resource attributes carry the host; the loss counters travel with each profile.
    let (request, _) = &requests[0];
    let resource = request.resource_profiles[0].resource.as_ref().unwrap();
    assert!(resource.attributes.iter().any(|kv| kv.key == "host.name"), "{:?}", resource.attributes);
    let d = request.dictionary.as_ref().unwrap();
    let profile = &request.resource_profiles[0].scope_profiles[0].profiles[0];
    let notes: Vec<&str> = profile.attribute_indices.iter().map(|&a| d.string_table[d.attribute_table[a as usize].key_strindex as usize].as_str()).collect();
    assert!(notes.contains(&"ember.counter.map_full"), "{notes:?}");
}

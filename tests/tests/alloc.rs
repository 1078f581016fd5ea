//! The `alloc` group end to end, on glibc's allocator: a process allocates 700 MiB from two
//! functions, 70% of the bytes from one, freeing each block at once, after leaking 64 MiB
//! from a third. Its heap profile splits the allocated bytes as the process did, holds the
//! leak in memory in use (labelled as a suspected leak once older than the leak age), and
//! nothing of the freed blocks; its counts agree with heaptrack's on the same fixture. Needs
//! root.
use std::{collections::HashMap, path::Path, process::Command, time::Duration};

use ember_tests::{contain, require_root, within, Agent, Decoded, Fixture, FixtureRun, Sample, TempDir, TestCgroups};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
const LEAK_MIB: u64 = 64;
/// A quarter of the default mean: some 11,000 samples of the 700 MiB, enough for the split
/// to be within its 2 points by a wide margin (its standard error is 0.4 points).
const SAMPLE_MEAN: &str = "64KiB";

/// Heap sample values: alloc_objects, alloc_space, inuse_objects, inuse_space.
const ALLOC_OBJECTS: usize = 0;
const ALLOC_SPACE: usize = 1;
const INUSE_SPACE: usize = 3;

/// Records the fixture (`command`) in `mode` with the alloc group (`sample_mean`, leak age
/// 2 s) for 8 s. The fixture outlives the recording: what it holds is still its own when the
/// agent takes its last look at the live table. Returns the profile, the fixture's pid, what
/// it printed, and the agent's log.
fn record_heap(dir: &TempDir, command: Command, mode: &str, args: &[&str], sample_mean: &str) -> (Decoded, u32, FixtureRun, String) {
    let out = dir.path("heap.pb.gz");
    let mut fixture = Fixture::spawn_with(command, mode, 14.0, args);
    let pid = fixture.pid();
    let pid_arg = pid.to_string();
    let agent_args = ["record", "-d", "8s", "-o", out.to_str().unwrap(), "--events", "alloc", "--pid", &pid_arg, "--alloc-sample", sample_mean, "--leak-age", "2s"];
    let mut agent = Agent::spawn(&agent_args);
    agent.wait_ready();
    fixture.start();
    let stderr = agent.wait_success(Duration::from_secs(60));
    let run = fixture.finish();
    (Decoded::read(&out), pid, run, stderr)
}

#[test]
fn allocations_split_by_caller_and_the_leak_is_what_stays_in_use() {
    require_root();
    let (profile, pid, run, stderr) = record_heap(&TempDir::new("alloc"), Command::new(FIXTURE), "alloc", &[&LEAK_MIB.to_string()], SAMPLE_MEAN);
    let (most_bytes, rest_bytes, leaked) = (run.lines[0][0] as f64, run.lines[0][1] as f64, run.lines[0][2] as f64);
    let samples = profile.samples_of(pid);
    assert!(!samples.is_empty(), "no heap samples of the fixture:\n{stderr}");
    assert_probed_without_steps(&stderr, "/libc.so");
    let of = |function: &str| samples.iter().copied().filter(|s| s.has_function(function)).collect::<Vec<&Sample>>();
    let (most, rest, leak) = (of("fixture::alloc_most"), of("fixture::alloc_rest"), of("fixture::leak"));
    let space = |samples: &[&Sample], index| Decoded::sum(samples, index) as f64;
    println!(
        "{} samples, {} sampled allocations; alloc_space: alloc_most {:.1} MiB (truth {:.1}), alloc_rest {:.1} (truth {:.1}), leak {:.1}; \
         inuse_space: leak {:.1} MiB (truth {:.1}), alloc_most {:.3}, alloc_rest {:.3}",
        samples.len(),
        profile.counter("alloc_samples"),
        space(&most, ALLOC_SPACE) / 1048576.0,
        most_bytes / 1048576.0,
        space(&rest, ALLOC_SPACE) / 1048576.0,
        rest_bytes / 1048576.0,
        space(&leak, ALLOC_SPACE) / 1048576.0,
        space(&leak, INUSE_SPACE) / 1048576.0,
        leaked / 1048576.0,
        space(&most, INUSE_SPACE) / 1048576.0,
        space(&rest, INUSE_SPACE) / 1048576.0,
    );
    assert_split(space(&most, ALLOC_SPACE), space(&rest, ALLOC_SPACE), &run);

    let leak_in_use = space(&leak, INUSE_SPACE);
    assert!((leak_in_use / leaked - 1.0).abs() <= 0.05, "the leak holds {:.1} MiB in use; it leaked {:.1}", leak_in_use / 1048576.0, leaked / 1048576.0);
    let freed_in_use = space(&most, INUSE_SPACE) + space(&rest, INUSE_SPACE);
    assert!(freed_in_use <= 0.01 * leaked, "{:.3} MiB of freed blocks still counted in use", freed_in_use / 1048576.0);

    // The leak label: on the leak's memory in use, and nowhere else.
    let labelled: Vec<&Sample> = samples.iter().copied().filter(|s| s.labels.get("leak").is_some_and(|l| l == "suspected")).collect();
    assert!(!labelled.is_empty(), "no sample carries leak=suspected");
    assert!(labelled.iter().all(|s| s.has_function("fixture::leak")), "leak=suspected on another site");
    let labelled_space = Decoded::sum(&labelled, INUSE_SPACE) as f64;
    assert!(labelled_space >= 0.99 * leak_in_use, "{:.1} of the leak's {:.1} MiB in use is labelled", labelled_space / 1048576.0, leak_in_use / 1048576.0);

    // heaptrack, on the same fixture: the same sites in the same order by calls, the same
    // calls within 5% (Ember's are estimates from some 10,000 samples), and the same leak.
    let (calls, leaked_by) = heaptrack_sites(&TempDir::new("alloc-heaptrack"), &["alloc", "1", &LEAK_MIB.to_string()], &["alloc_most", "alloc_rest", "leak"]);
    let ember_calls: Vec<f64> = [&most, &rest, &leak].iter().map(|s| space(s, ALLOC_OBJECTS)).collect();
    println!("calls: heaptrack {calls:?}, Ember {ember_calls:?}; leaked: heaptrack {leaked_by:?}");
    for (i, site) in ["alloc_most", "alloc_rest", "leak"].iter().enumerate() {
        assert!((ember_calls[i] / calls[i] - 1.0).abs() <= 0.05, "{site}: Ember estimates {:.0} calls, heaptrack counted {:.0}", ember_calls[i], calls[i]);
    }
    assert!((leak_in_use / leaked_by[2] - 1.0).abs() <= 0.05, "the leak: Ember {:.1} MiB in use, heaptrack {:.1} leaked", leak_in_use / 1048576.0, leaked_by[2] / 1048576.0);
    assert!(leaked_by[0] + leaked_by[1] == 0.0, "heaptrack saw the freed sites leak");
}

/// The `alloc` mode's two sites' alloc_space (`most`, `rest`) against what the fixture
/// allocated (`run`): the split within 2 points, the sum within 5%.
fn assert_split(most: f64, rest: f64, run: &FixtureRun) {
    let (most_bytes, rest_bytes) = (run.lines[0][0] as f64, run.lines[0][1] as f64);
    let share = most / (most + rest);
    let truth = most_bytes / (most_bytes + rest_bytes);
    assert!((share - truth).abs() <= 0.02, "alloc_most allocated {share:.3} of the two sites' bytes; truth {truth:.3}");
    let both = most + rest;
    assert!((both / (most_bytes + rest_bytes) - 1.0).abs() <= 0.05, "the two sites' alloc_space is {:.1} MiB of {:.1}", both / 1048576.0, (most_bytes + rest_bytes) / 1048576.0);
}

/// `allocator` was the allocator probed, and each of its probes is on an instruction the
/// kernel emulates: glibc's, jemalloc's and tcmalloc's functions each have one near their
/// entry, and tcmalloc's sampled path is probed on calls (a stepped probe costs some 10 µs a
/// hit more on a VM).
fn assert_probed_without_steps(stderr: &str, allocator: &str) {
    let line = stderr.lines().find(|l| l.contains("allocator probed") && l.contains(allocator));
    let line = line.unwrap_or_else(|| panic!("{allocator} was not the allocator probed:\n{stderr}"));
    assert!(line.contains("stepped=\"\""), "probes the kernel steps: {line}");
}

/// A library of Debian's in the multiarch directory (`cargo xtask setup` installs the ones
/// the tests preload).
fn debian_library(name: &str) -> std::path::PathBuf {
    let path = Path::new("/usr/lib").join(format!("{}-linux-gnu", std::env::consts::ARCH)).join(name);
    assert!(path.is_file(), "{} is missing: run `cargo xtask setup`", path.display());
    path
}

/// The same fixture on Debian's jemalloc and tcmalloc, preloaded (`cargo xtask setup`
/// installs them): the agent probes the preloaded allocator, not libc, and the split and the
/// leak come out as on glibc.
#[test]
fn preloaded_jemalloc_and_tcmalloc_are_probed_and_give_the_split_and_the_leak() {
    require_root();
    // jemalloc with its own profiling on too: Ember cannot use its sampled path, probes every
    // call as without it, and says why.
    for (library, malloc_conf) in [("libjemalloc.so.2", None), ("libjemalloc.so.2", Some("prof:true")), ("libtcmalloc_minimal.so.4", None)] {
        let path = debian_library(library);
        let mut command = Command::new(FIXTURE);
        command.env("LD_PRELOAD", &path);
        if let Some(conf) = malloc_conf {
            command.env("MALLOC_CONF", conf);
        }
        let (profile, pid, run, stderr) = record_heap(&TempDir::new("alloc-preloaded"), command, "alloc", &[&LEAK_MIB.to_string()], SAMPLE_MEAN);
        assert_probed_without_steps(&stderr, library);
        let said = stderr.contains("jemalloc samples this process's allocations itself");
        assert_eq!(said, malloc_conf.is_some(), "{library} with MALLOC_CONF {malloc_conf:?}: jemalloc's own sampling said {said}:\n{stderr}");
        assert_split_and_leak(&profile, pid, &run, &format!("{library} MALLOC_CONF={}", malloc_conf.unwrap_or("")));
    }
}

/// The `alloc` fixture's profile (`label` says which run): the split of the two sites'
/// allocated bytes, the leak in use within 5%, nothing of the freed blocks in use.
fn assert_split_and_leak(profile: &Decoded, pid: u32, run: &FixtureRun, label: &str) {
    let samples = profile.samples_of(pid);
    let of = |function: &str, index| in_function(&samples, function, index);
    let (leak_in_use, leaked) = (of("fixture::leak", INUSE_SPACE), run.lines[0][2] as f64);
    let freed_in_use = of("fixture::alloc_most", INUSE_SPACE) + of("fixture::alloc_rest", INUSE_SPACE);
    println!(
        "{label}: alloc_space alloc_most {:.1} MiB, alloc_rest {:.1} MiB; in use: leak {:.1} MiB (leaked {:.1}), freed sites {:.3} MiB",
        of("fixture::alloc_most", ALLOC_SPACE) / 1048576.0, of("fixture::alloc_rest", ALLOC_SPACE) / 1048576.0,
        leak_in_use / 1048576.0, leaked / 1048576.0, freed_in_use / 1048576.0
    );
    assert_split(of("fixture::alloc_most", ALLOC_SPACE), of("fixture::alloc_rest", ALLOC_SPACE), run);
    assert!((leak_in_use / leaked - 1.0).abs() <= 0.05, "{label}: the leak holds {:.1} MiB in use; it leaked {:.1}", leak_in_use / 1048576.0, leaked / 1048576.0);
    assert!(freed_in_use <= 0.01 * leaked, "{label}: {:.3} MiB of freed blocks still counted in use", freed_in_use / 1048576.0);
}

/// Sample value `index` summed over the `samples` with `function` on their stacks.
fn in_function(samples: &[&Sample], function: &str, index: usize) -> f64 {
    Decoded::sum(&samples.iter().copied().filter(|s| s.has_function(function)).collect::<Vec<&Sample>>(), index) as f64
}

/// The BPF links process `pid` holds open: its programs' attachments, a probe each.
fn links_of(pid: u32) -> usize {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).expect("the agent's fds");
    fds.flatten().filter(|fd| std::fs::read_link(fd.path()).is_ok_and(|target| target.to_string_lossy().contains("bpf_link"))).count()
}

/// The alloc group given a cgroup, not pids: a process that joins the cgroup after the agent
/// started is probed (the agent reads the cgroup's members ten times a second), and its
/// allocations split as it made them; once it has ended, its probes are out.
#[test]
fn a_process_that_joins_the_chosen_cgroup_later_is_probed_and_its_probes_go_when_it_ends() {
    require_root();
    let dir = TempDir::new("alloc-cgroup");
    let mut cgroups = TestCgroups::new();
    cgroups.create("alloc");
    let out = dir.path("heap.pb.gz");
    let cgroup = cgroups.dir("alloc");
    let agent_args = ["record", "-d", "10s", "-o", out.to_str().unwrap(), "--events", "alloc", "--cgroup", cgroup.to_str().unwrap(), "--alloc-sample", SAMPLE_MEAN];
    let mut agent = Agent::spawn(&agent_args);
    agent.wait_ready();
    // The group's other programs (exec, exit...): no probe is in before a process joins.
    let unprobed_links = links_of(agent.pid());
    let mut fixture = Fixture::spawn_with(Command::new(FIXTURE), "alloc", 3.0, &[&LEAK_MIB.to_string()]);
    let pid = fixture.pid();
    cgroups.enter("alloc", pid);
    assert!(within(Duration::from_secs(5), || links_of(agent.pid()) > unprobed_links), "the process that joined the cgroup was not probed within 5 s:\n{}", agent.stderr());
    fixture.start();
    let run = fixture.finish();
    let unprobed = within(Duration::from_secs(3), || links_of(agent.pid()) == unprobed_links);
    let stderr = agent.wait_success(Duration::from_secs(60));
    assert!(unprobed, "the probes of the process that ended stayed in:\n{stderr}");
    let profile = Decoded::read(&out);
    let samples = profile.samples_of(pid);
    let of = |function: &str, index| in_function(&samples, function, index);
    let space = |function: &str| of(function, ALLOC_SPACE);
    println!(
        "alloc_space: alloc_most {:.1} MiB, alloc_rest {:.1} MiB, leak {:.1} MiB; the fixture: {:?}",
        space("fixture::alloc_most") / 1048576.0, space("fixture::alloc_rest") / 1048576.0, space("fixture::leak") / 1048576.0, run.lines
    );
    assert_split(space("fixture::alloc_most"), space("fixture::alloc_rest"), &run);
    // The leak was seen, and given back when the process ended.
    assert!(space("fixture::leak") > 0.5 * run.lines[0][2] as f64, "the leak's allocations were not seen");
    assert_eq!(of("fixture::leak", INUSE_SPACE), 0.0, "the ended process's leak is still in use");
}

/// Runs the fixture (`args`) under heaptrack and returns, per function of `sites`, the calls
/// to allocation functions under it and the bytes it leaked, from heaptrack_print's
/// flame-graph files (root first, "frame;...;frame; count" a line).
fn heaptrack_sites(dir: &TempDir, args: &[&str], sites: &[&str]) -> (Vec<f64>, Vec<f64>) {
    let data = dir.path("heaptrack");
    let ran = Command::new("heaptrack").arg("-o").arg(&data).arg(FIXTURE).args(args).output().expect("running heaptrack (cargo xtask setup installs it)");
    assert!(ran.status.success(), "heaptrack: {}", String::from_utf8_lossy(&ran.stderr));
    let by_site = |cost: &str| -> Vec<f64> {
        let stacks = dir.path(&format!("{cost}.txt"));
        let printed = Command::new("heaptrack_print").arg("-f").arg(data.with_extension("zst")).args(["-p", "0", "-a", "0", "-T", "0", "--flamegraph-cost-type", cost, "-F"]).arg(&stacks).output().expect("heaptrack_print");
        assert!(printed.status.success(), "heaptrack_print: {}", String::from_utf8_lossy(&printed.stderr));
        let mut sums: HashMap<&str, f64> = HashMap::new();
        for line in std::fs::read_to_string(Path::new(&stacks)).expect("heaptrack's stacks").lines() {
            let Some((frames, count)) = line.rsplit_once(' ') else { continue };
            for site in sites {
                if frames.split(';').any(|f| f.starts_with(&format!("fixture::{site}"))) {
                    *sums.entry(site).or_default() += count.parse::<f64>().expect("a count");
                }
            }
        }
        sites.iter().map(|site| sums.get(site).copied().unwrap_or(0.0)).collect()
    };
    (by_site("allocations"), by_site("leaked"))
}

/// calloc, realloc (from NULL, then grown: the block it replaces is given back),
/// posix_memalign and aligned_alloc each hold 4 MiB in use at the end; blocks given back by
/// `realloc(p, 0)` hold nothing, and `free(NULL)` disturbs nothing. Sampled at a mean of 16
/// KiB, every 256 KiB block is sampled (its chance is 1 - e^-16), so the figures are exact.
#[test]
fn every_allocation_call_is_tracked_until_its_block_is_given_back() {
    require_root();
    let (profile, pid, run, stderr) = record_heap(&TempDir::new("alloc-calls"), Command::new(FIXTURE), "alloc-calls", &[], "16KiB");
    check_calls(&profile, pid, &run, &stderr);
}

/// A process in a mount namespace of its own, with its own copies of the fixture and of every
/// library it loads (a container's): its allocator is the libc it maps, not the host's, and
/// every call is seen there.
#[test]
fn a_process_with_its_own_libc_in_its_own_mount_namespace_is_probed_in_that_libc() {
    require_root();
    let dir = TempDir::new("alloc-container");
    let root = dir.path("root");
    let ldd = Command::new("ldd").arg(FIXTURE).output().expect("ldd");
    let libraries: Vec<String> = String::from_utf8_lossy(&ldd.stdout).split_whitespace().filter(|t| t.starts_with('/')).map(str::to_string).collect();
    assert!(libraries.iter().any(|l| l.contains("/libc.so")), "ldd names no libc: {libraries:?}");
    for (from, to) in libraries.iter().map(|l| (l.as_str(), l.trim_start_matches('/').to_string())).chain([(FIXTURE, "bin/fixture".to_string())]) {
        let to = root.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copying {from}: {e}"));
    }
    let mut command = Command::new("/bin/fixture");
    contain(&mut command, &root);
    // The probes on the host's libc would see none of these calls: the counts come out exact
    // only from the copy.
    let (profile, pid, run, stderr) = record_heap(&dir, command, "alloc-calls", &[], "16KiB");
    check_calls(&profile, pid, &run, &stderr);
}

/// What `alloc-calls` holds and gave back, call by call, exactly.
fn check_calls(profile: &Decoded, pid: u32, run: &FixtureRun, stderr: &str) {
    let held = run.lines[0][0] as i64;
    let samples = profile.samples_of(pid);
    let of = |function: &str| samples.iter().copied().filter(|s| s.has_function(function)).collect::<Vec<&Sample>>();
    for function in ["fixture::via_calloc", "fixture::via_realloc", "fixture::via_posix_memalign", "fixture::via_aligned_alloc"] {
        let in_use = Decoded::sum(&of(function), INUSE_SPACE);
        assert_eq!(in_use, held, "{function} holds {in_use} bytes in use; it kept {held}\n{stderr}");
    }
    // Each realloc allocated 256 KiB, then 512 KiB: once each, though glibc's realloc from
    // NULL calls its own malloc.
    assert_eq!(Decoded::sum(&of("fixture::via_realloc"), ALLOC_SPACE), 8 * (768 << 10), "via_realloc's alloc_space");
    let freed = of("fixture::freed_by_realloc");
    assert_eq!(Decoded::sum(&freed, ALLOC_SPACE), 16 * (256 << 10), "freed_by_realloc's alloc_space");
    assert_eq!(Decoded::sum(&freed, INUSE_SPACE), 0, "blocks given back by realloc(p, 0) are not in use");
}

/// Under a CPU budget, probes whose traps take it come out: a process that does nothing but
/// malloc and free (some 100,000 calls a second under the probes, microseconds of traps each)
/// is freed of them within a few intervals, and the profiles say so and what they cost.
#[test]
fn allocator_probes_come_out_when_their_traps_take_the_cpu_budget() {
    require_root();
    let dir = TempDir::new("alloc-budget");
    let out = dir.path("profiles");
    let mut fixture = Fixture::spawn_with(Command::new(FIXTURE), "alloc-loop", 12.0, &[]);
    let pid = fixture.pid().to_string();
    let args = ["run", "--events", "alloc", "--pid", &pid, "--cpu-budget", "1%", "--interval", "1s", "--output-dir", out.to_str().unwrap()];
    let mut agent = Agent::spawn(&args);
    agent.wait_ready();
    fixture.start();
    let run = fixture.finish();
    agent.signal(libc::SIGINT);
    let stderr = agent.wait_success(Duration::from_secs(30));
    let mut profiles = Decoded::read_kind(&out, "heap");
    profiles.sort_by_key(|p| p.profile.time_nanos);
    let field = |p: &Decoded, key: &str| p.comment_field(key).unwrap_or("-").to_string();
    for p in &profiles {
        println!("probes {} agent {} bpf {} paused {:?} calls {}", field(p, "ember.overhead.probes"), field(p, "ember.overhead.agent"), field(p, "ember.overhead.bpf"), field(p, "ember.paused"), p.counter("alloc_calls"));
    }
    println!("{} pairs in 12 s", run.lines[0][0]);
    let paused = |p: &Decoded| p.comment_field("ember.paused").is_some_and(|v| v.split(',').any(|what| what == "alloc_probes"));
    let first = profiles.iter().position(paused).unwrap_or_else(|| panic!("the probes were never taken out:\n{stderr}"));
    assert!(first <= 4, "the probes came out only in interval {first}");
    let before: f64 = profiles[first].comment_field("ember.overhead.probes").and_then(|v| v.parse().ok()).expect("the interval's probe cost");
    assert!(before > 0.01, "the interval that took the probes out says they cost {before}");
    assert!(profiles[first..].iter().all(paused), "the probes came back");
    assert!(profiles[first + 1..].iter().all(|p| p.counter("alloc_calls") == 0), "calls were seen after the probes came out");
    assert!(stderr.contains("allocator probes taken out for the CPU budget"), "no warning said so:\n{stderr}");
}

/// tcmalloc's own sampling, one allocation per this many bytes on average: some 44,000
/// samples of the 700 MiB and 4,000 of the leak, whose standard errors (0.2 points of the
/// split, 1.6% of the leak) are well within the checks.
const TCMALLOC_MEAN: u64 = 16 << 10;

/// The full tcmalloc (Debian's libgoogle-perftools4) with its own sampler on: the agent puts
/// two probes on its sampled path, none at each call, and the profile splits the bytes and
/// holds the leak as on glibc, scaled by tcmalloc's mean rather than the group's.
#[test]
fn tcmalloc_that_samples_itself_is_probed_on_its_sampled_path_only() {
    require_root();
    let mut command = Command::new(FIXTURE);
    command.env("LD_PRELOAD", debian_library("libtcmalloc.so.4")).env("TCMALLOC_SAMPLE_PARAMETER", TCMALLOC_MEAN.to_string());
    // tcmalloc leaves a thread's first 16 MiB unsampled when its period comes from the
    // environment: the fixture allocates and frees 17 MiB first.
    let (profile, pid, run, stderr) = record_heap(&TempDir::new("alloc-tcmalloc-sampled"), command, "alloc", &[&LEAK_MIB.to_string(), "17"], SAMPLE_MEAN);
    assert!(stderr.contains("probed on its own sampled path"), "tcmalloc's sampling was not found:\n{stderr}");
    let probed = stderr.lines().find(|l| l.contains("allocator probed")).unwrap_or_else(|| panic!("nothing probed:\n{stderr}"));
    assert!(probed.contains("libtcmalloc.so.4") && probed.contains("probes=2 "), "{probed}");
    // On the two calls that link and unlink a sampled object, not the functions they call.
    assert_probed_without_steps(&stderr, "libtcmalloc.so.4");
    assert_split_and_leak(&profile, pid, &run, "tcmalloc sampling itself");
}

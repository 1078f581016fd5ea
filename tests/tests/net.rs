//! Network profiles end to end: real TCP transfers on loopback and across a veth pair between
//! two network namespaces the test creates, a real drop, the real tracepoints. Needs root.
use std::process::Command;

use ember_tests::{kind_path, record_fixtures, require_root, Decoded, Fixture, NetnsPair, TempDir};

const FIXTURE: &str = env!("CARGO_BIN_EXE_fixture");
/// Held by each test that transfers over loopback: host-wide profiles of `lo` would count the
/// other's bytes too.
static LOOPBACK: std::sync::Mutex<()> = std::sync::Mutex::new(());
const BYTES: u64 = 8 << 20;
/// Ethernet (14) + IPv4 (20) + TCP with timestamps (32): what each transmitted skb carries
/// besides payload. Received skbs have the Ethernet header pulled already.
const TX_HEADERS: i64 = 66;
const RX_HEADERS: i64 = 52;

/// Payload estimate of a set of samples: bytes minus headers.
fn payload(samples: &[&ember_tests::Sample], headers: i64) -> i64 {
    Decoded::sum(samples, 1) - Decoded::sum(samples, 0) * headers
}

fn assert_close(what: &str, measured: i64, truth: u64) {
    let error = (measured as f64 - truth as f64).abs() / truth as f64;
    assert!(error <= 0.02, "{what}: {measured} bytes of payload, truth {truth} ({} retransmitted)", truth.saturating_sub(BYTES));
}

/// A finished transfer: its profiles, the sender's pid, and the payload bytes the sender
/// transmitted (BYTES and any retransmissions), which every device on the path carried.
struct Transfer {
    tx: Decoded,
    rx: Decoded,
    sender_pid: u32,
    transmitted: u64,
}

/// Records a transfer of BYTES from `sender` to `receiver`.
fn transfer(dir: &TempDir, receiver: Fixture, sender: Fixture) -> Transfer {
    let sender_pid = sender.pid();
    let args = ["--events", "net", "--net-events", "net:net_dev_queue,net:netif_receive_skb"];
    let (out, runs) = record_fixtures(dir, vec![receiver, sender], 3.0, &args);
    assert_eq!(runs[0].lines[0][0], BYTES, "the receiver got every byte");
    let (tx, rx) = (Decoded::read(&kind_path(&out, "net-tx")), Decoded::read(&kind_path(&out, "net-rx")));
    Transfer { tx, rx, sender_pid, transmitted: runs[1].lines[0][2] }
}

fn check_transfer(transfer: &Transfer, tx_device: &str, rx_device: &str) {
    let Transfer { tx, rx, sender_pid, transmitted } = transfer;
    let sent: Vec<_> = tx
        .samples_labelled("pid", &sender_pid.to_string())
        .into_iter()
        .filter(|s| s.labels.get("device").map(String::as_str) == Some(tx_device))
        // Data leaves from the sender's syscalls and from softirq (as ACKs arrive): all of it
        // is the sender's, through its socket. (ACKs for the receiver's socket, which never
        // sends, can run on the sender's task: those are attributed to the current task.)
        .filter(|s| s.labels.get("attributed_to").map(String::as_str) == Some("socket-owner"))
        .collect();
    assert_close(&format!("transmit on {tx_device} by the sender"), payload(&sent, TX_HEADERS), *transmitted);
    let via_send_all: Vec<_> = sent.iter().copied().filter(|s| s.has_function("fixture::send_all")).collect();
    assert_close("transmit under fixture::send_all", payload(&via_send_all, TX_HEADERS), *transmitted);

    let received = rx.samples_labelled("device", rx_device);
    assert_close(&format!("receive on {rx_device}"), payload(&received, RX_HEADERS), *transmitted);
    // Kernel receive-path stacks, or (rarely, counted) a marker saying why one was lost.
    let explained = |s: &&ember_tests::Sample| {
        s.frames.iter().any(|f| f.mapping == "[kernel.kallsyms]" || f.function.starts_with("[kernel stack lost"))
    };
    assert!(received.iter().all(explained), "receive samples without kernel stacks");
    let with_stack = received.iter().filter(|s| s.frames.iter().any(|f| f.function.contains("netif_receive_skb"))).count();
    assert!(with_stack * 10 >= received.len() * 9, "{with_stack} of {} receive samples show netif_receive_skb", received.len());
    // Receive runs on whatever task was current: the labels must say so.
    assert!(received.iter().all(|s| s.labels.contains_key("ran_on_comm") && !s.labels.contains_key("pid")));
}

#[test]
fn loopback_transfer_is_attributed_to_the_sender_and_counted_per_device() {
    require_root();
    let _loopback = LOOPBACK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("net-lo");
    let address = format!("127.0.0.1:{}", 40000 + std::process::id() % 20000);
    let receiver = Fixture::spawn_with(Command::new(FIXTURE), "tcp-recv", 3.0, &[&address]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let sender = Fixture::spawn_with(Command::new(FIXTURE), "tcp-send", 3.0, &[&address, &BYTES.to_string()]);
    check_transfer(&transfer(&dir, receiver, sender), "lo", "lo");
}

#[test]
fn veth_transfer_between_namespaces_is_attributed_per_device() {
    require_root();
    let dir = TempDir::new("net-veth");
    let pair = NetnsPair::create("veth");
    let address = format!("{}:5001", NetnsPair::ADDRESS_B);
    let receiver = Fixture::spawn_with(NetnsPair::command(&pair.b, FIXTURE), "tcp-recv", 3.0, &[&address]);
    std::thread::sleep(std::time::Duration::from_millis(200));
    let sender = Fixture::spawn_with(NetnsPair::command(&pair.a, FIXTURE), "tcp-send", 3.0, &[&address, &BYTES.to_string()]);
    check_transfer(&transfer(&dir, receiver, sender), "ember-va", "ember-vb");
}

/// With `--pid`, a sender's transmits that leave from softirq on another task (as ACKs
/// arrive) are still the sender's: the filter applies to the socket's owner.
#[test]
fn pid_filter_keeps_transmits_sent_from_softirq_on_other_tasks() {
    require_root();
    let _loopback = LOOPBACK.lock().unwrap_or_else(|e| e.into_inner());
    let dir = TempDir::new("net-pid");
    let address = format!("127.0.0.1:{}", 40000 + (std::process::id() + 7) % 20000);
    // A slow reader: the sender's window fills, and most data leaves when the receiver's
    // reads open it again, from softirq on the receiver's task.
    let receiver = Fixture::spawn_with(Command::new(FIXTURE), "tcp-recv", 3.0, &[&address, "500"]);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let sender = Fixture::spawn_with(Command::new(FIXTURE), "tcp-send", 3.0, &[&address, &BYTES.to_string()]);
    let sender_pid = sender.pid().to_string();
    let args = ["--events", "net", "--net-events", "net:net_dev_queue", "--pid", &sender_pid];
    let (out, runs) = record_fixtures(&dir, vec![receiver, sender], 3.0, &args);
    assert_eq!(runs[0].lines[0][0], BYTES, "the receiver got every byte");
    let tx = Decoded::read(&out);
    let sent: Vec<_> = tx
        .samples_labelled("pid", &sender_pid)
        .into_iter()
        .filter(|s| s.labels.get("attributed_to").map(String::as_str) == Some("socket-owner"))
        .collect();
    assert_close("transmit by the sender with --pid", payload(&sent, TX_HEADERS), runs[1].lines[0][2]);
    let others = tx.samples.iter().filter(|s| s.labels.get("pid").is_some_and(|p| *p != sender_pid)).count();
    assert_eq!(others, 0, "samples of other processes passed the pid filter");
    // The receiver's own transmits (its ACKs) are counted as filtered network events, apart
    // from filtered on-CPU samples (none: on-CPU is not recorded).
    assert!(tx.counter("net_filtered") > 0 && tx.counter("filtered") == 0, "filtered: {} network events, {} samples", tx.counter("net_filtered"), tx.counter("filtered"));
}

#[test]
fn drops_show_up_with_their_reason() {
    require_root();
    let dir = TempDir::new("net-drop");
    let fixture = Fixture::spawn_with(Command::new(FIXTURE), "udp-closed", 1.0, &["50"]);
    let args = ["--events", "net", "--net-events", "skb:kfree_skb"];
    let (out, _) = record_fixtures(&dir, vec![fixture], 1.0, &args);
    let drops = Decoded::read(&out);
    let no_socket = drops.samples_labelled("reason", "NO_SOCKET");
    assert!(Decoded::total(&no_socket) >= 50, "{} NO_SOCKET drops, 50 datagrams sent to a closed port", Decoded::total(&no_socket));
}

#[test]
fn unknown_tracepoint_is_a_one_line_error_listing_what_exists() {
    let output = Command::new(ember_tests::agent_bin())
        .args(["record", "-d", "1s", "--events", "net", "--net-events", "net:net_rx_action"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("unknown tracepoint net:net_rx_action") && stderr.contains("net:net_dev_queue"), "{stderr}");
}

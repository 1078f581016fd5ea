//! A stand-in for the Kubernetes API server on loopback. It answers the pod list and watch
//! requests that a kube client makes, in the API's own JSON shapes. List and watch honour the
//! spec.nodeName field selector, and a watch replays the events after its resourceVersion.
//! Pods can be added while it runs, and `stop` makes it go away as a crashed server would.
use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::Duration,
};

use serde_json::{json, Value};

#[derive(Default)]
struct State {
    version: u64,
    pods: Vec<Value>,
    /// (resourceVersion, pod, watch event line) of every change, for watches that resume.
    events: Vec<(u64, Value, String)>,
    /// Open watch streams and the node each selects; each gets new events as chunks.
    watchers: Vec<(Option<String>, TcpStream)>,
    /// Every accepted connection, closed by `stop`.
    connections: Vec<TcpStream>,
    /// Request targets seen ("/api/v1/pods?...").
    requests: Vec<String>,
}

pub struct FakeApiServer {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
    stopping: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

/// A pod in the shape the API server sends: metadata, spec.nodeName and the container
/// statuses that carry each container's runtime id.
pub fn pod(uid: &str, name: &str, namespace: &str, node: &str, labels: &[(&str, &str)], containers: &[(&str, &str)]) -> Value {
    let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels},
        "spec": {"nodeName": node, "containers": containers.iter().map(|(name, _)| json!({"name": name, "image": "fixture"})).collect::<Vec<_>>()},
        "status": {
            "phase": "Running",
            "containerStatuses": containers.iter().map(|(name, id)| json!({
                "name": name, "containerID": format!("containerd://{id}"), "image": "fixture", "imageID": "",
                "ready": true, "restartCount": 0, "started": true
            })).collect::<Vec<_>>(),
        },
    })
}

impl FakeApiServer {
    pub fn start(pods: Vec<Value>) -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding the fake API server");
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        for pod in pods {
            add(&state, pod);
        }
        let stopping = Arc::new(AtomicBool::new(false));
        let (accept_state, accept_stopping) = (state.clone(), stopping.clone());
        let accept = std::thread::spawn(move || {
            while !accept_stopping.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        accept_state.lock().unwrap().connections.push(stream.try_clone().unwrap());
                        let state = accept_state.clone();
                        std::thread::spawn(move || serve(stream, &state));
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(10)),
                    Err(e) => panic!("fake API server accept: {e}"),
                }
            }
            // The listener drops here: new connections are refused.
        });
        FakeApiServer { address, state, stopping, accept: Some(accept) }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Adds a pod and tells every open watch (ADDED).
    pub fn add(&self, pod: Value) {
        add(&self.state, pod);
    }

    pub fn requests(&self) -> Vec<String> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Closes the listener and every connection, mid-watch.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(accept) = self.accept.take() {
            accept.join().unwrap();
        }
        let mut state = self.state.lock().unwrap();
        for connection in state.connections.drain(..) {
            let _ = connection.shutdown(std::net::Shutdown::Both);
        }
        state.watchers.clear();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn add(state: &Mutex<State>, mut pod: Value) {
    let mut state = state.lock().unwrap();
    state.version += 1;
    let version = state.version;
    pod["metadata"]["resourceVersion"] = json!(version.to_string());
    let line = json!({"type": "ADDED", "object": pod}).to_string();
    state.watchers.retain_mut(|(node, w)| !on_node(&pod, node) || write_chunk(w, &line).is_ok());
    state.pods.push(pod.clone());
    state.events.push((version, pod, line));
}

fn on_node(pod: &Value, node: &Option<String>) -> bool {
    node.as_deref().is_none_or(|n| pod["spec"]["nodeName"] == n)
}

fn write_chunk(stream: &mut TcpStream, line: &str) -> std::io::Result<()> {
    let data = format!("{line}\n");
    write!(stream, "{:x}\r\n{data}\r\n", data.len())?;
    stream.flush()
}

/// The value of `key` in a query string, percent-decoded.
fn query_value(query: &str, key: &str) -> Option<String> {
    let raw = query.split('&').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))?;
    let mut out = Vec::new();
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'%' => {
                let hex: String = bytes.by_ref().take(2).map(char::from).collect();
                out.push(u8::from_str_radix(&hex, 16).expect("percent escape"));
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
    }
    Some(String::from_utf8(out).expect("utf-8 query"))
}

/// Answers requests on one keep-alive connection until the client closes it or it becomes a
/// watch (then the stream stays open in `watchers`).
fn serve(stream: TcpStream, state: &Mutex<State>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut stream = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            if header.trim().is_empty() {
                break;
            }
        }
        let target = request_line.split_whitespace().nth(1).unwrap_or_default().to_string();
        state.lock().unwrap().requests.push(target.clone());
        let (path, query) = target.split_once('?').unwrap_or((&target, ""));
        if path != "/api/v1/pods" {
            let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404}).to_string();
            let _ = write!(stream, "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
            continue;
        }
        // The only field selector a node agent sends: spec.nodeName=<node>.
        let node = query_value(query, "fieldSelector").and_then(|s| s.strip_prefix("spec.nodeName=").map(str::to_string));
        let mut state = state.lock().unwrap();
        if query_value(query, "watch").as_deref() == Some("true") {
            let since: u64 = query_value(query, "resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
            let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
            if stream.write_all(head.as_bytes()).is_err() {
                return;
            }
            let replay: Vec<String> = state
                .events
                .iter()
                .filter(|(v, pod, _)| *v > since && on_node(pod, &node))
                .map(|(_, _, line)| line.clone())
                .collect();
            for line in replay {
                if write_chunk(&mut stream, &line).is_err() {
                    return;
                }
            }
            state.watchers.push((node, stream));
            return;
        }
        let items: Vec<&Value> = state.pods.iter().filter(|p| on_node(p, &node)).collect();
        let body = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": state.version.to_string()}, "items": items}).to_string();
        drop(state);
        if write!(stream, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).is_err() {
            return;
        }
    }
}

//! A real browser for the web UI's tests: Debian's headless Chromium driven by chromedriver
//! over the W3C WebDriver protocol (JSON over HTTP on loopback). Only what the tests use:
//! open a page, run a script in it, click, drag and type with real input events, take a
//! screenshot, and read the console.
use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use base64::Engine as _;
use serde_json::{json, Value};

use crate::{http_request, transport::free_address};

pub struct Browser {
    driver: Child,
    address: SocketAddr,
    session: String,
}

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The window's inner size: wide enough for the query bar on one line.
pub const WIDTH: u32 = 1400;

impl Browser {
    /// Starts chromedriver and a headless Chromium session; panics with the reason if either
    /// is missing (`cargo xtask setup` installs both).
    pub fn start() -> Browser {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(Path::new(program).exists(), "{program} is missing: run `cargo xtask setup` (Debian's chromium and chromium-driver)");
        }
        let address = free_address();
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={}", address.port()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(address).is_err() {
            assert!(Instant::now() < deadline, "chromedriver not listening after 20 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut browser = Browser { driver, address, session: String::new() };
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                // Root in CI: Chromium's sandbox refuses to run as root.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", format!("--window-size={WIDTH},1000")],
            },
            "goog:loggingPrefs": {"browser": "ALL"},
        }}});
        let created = browser.call("POST", "/session", capabilities);
        browser.session = created["sessionId"].as_str().expect("a WebDriver session id").to_string();
        browser
    }

    /// One WebDriver command; panics on a WebDriver error. Returns its `value`.
    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let body = if method == "GET" || method == "DELETE" { Vec::new() } else { body.to_string().into_bytes() };
        let headers = "Content-Type: application/json\r\n";
        let (status, answer) = http_request(self.address, method, path, headers, &body);
        let answer: Value = serde_json::from_slice(&answer).unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        assert_eq!(status, 200, "WebDriver {method} {path}: {answer}");
        answer["value"].clone()
    }

    fn session_call(&self, method: &str, path: &str, body: Value) -> Value {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    pub fn goto(&self, url: &str) {
        self.session_call("POST", "/url", json!({"url": url}));
    }

    pub fn url(&self) -> String {
        self.session_call("GET", "/url", Value::Null).as_str().unwrap_or_default().to_string()
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page; returns what it
    /// returns.
    pub fn run(&self, script: &str, args: Value) -> Value {
        self.session_call("POST", "/execute/sync", json!({"script": script, "args": args}))
    }

    /// Polls `condition` (a script returning a boolean) until true, at most `limit`.
    pub fn wait_until(&self, what: &str, condition: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.run(condition, json!([])) != json!(true) {
            assert!(Instant::now() < deadline, "{what}: still not so after {limit:?} (console: {:?})", self.console());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Real pointer input at viewport coordinates: a click, or a press, moves and a release.
    pub fn click(&self, point: (f64, f64)) {
        self.pointer(&[move_to(point, 0), down(), up()]);
    }

    pub fn drag(&self, from: (f64, f64), to: (f64, f64)) {
        let halfway = ((from.0 + to.0) / 2.0, (from.1 + to.1) / 2.0);
        self.pointer(&[move_to(from, 0), down(), move_to(halfway, 100), move_to(to, 100), up()]);
    }

    /// Moves the mouse through `points` (viewport coordinates), `ms` milliseconds each.
    pub fn hover_path(&self, points: &[(f64, f64)], ms: u64) {
        self.pointer(&points.iter().map(|&point| move_to(point, ms)).collect::<Vec<_>>());
    }

    fn pointer(&self, actions: &[Value]) {
        let sequence = json!({"actions": [{"type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"}, "actions": actions}]});
        self.session_call("POST", "/actions", sequence);
        self.session_call("DELETE", "/actions", Value::Null);
    }

    /// Types `text` into the element `css` selects, as key presses.
    pub fn type_into(&self, css: &str, text: &str) {
        let element = self.session_call("POST", "/element", json!({"using": "css selector", "value": css}));
        let id = element.as_object().and_then(|o| o.values().next()).and_then(Value::as_str).expect("an element id").to_string();
        self.session_call("POST", &format!("/element/{id}/value"), json!({"text": text}));
    }

    /// Saves a PNG of the window.
    pub fn screenshot(&self, path: &Path) {
        let png = self.session_call("GET", "/screenshot", Value::Null);
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().expect("base64 PNG")).expect("decoding the screenshot");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    /// The console's messages since the last call, as "LEVEL message".
    pub fn console(&self) -> Vec<String> {
        let entries = self.session_call("POST", "/se/log", json!({"type": "browser"}));
        entries
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| format!("{} {}", e["level"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")))
            .collect()
    }
}

/// A pointer move to viewport coordinates, taking `ms` milliseconds.
fn move_to((x, y): (f64, f64), ms: u64) -> Value {
    json!({"type": "pointerMove", "x": x as i64, "y": y as i64, "origin": "viewport", "duration": ms})
}

fn down() -> Value {
    json!({"type": "pointerDown", "button": 0})
}

fn up() -> Value {
    json!({"type": "pointerUp", "button": 0})
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = http_request(self.address, "DELETE", &format!("/session/{}", self.session), "", b"");
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

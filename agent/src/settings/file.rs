//! The configuration file (TOML), as written: every key optional, unknown keys are errors (so
//! a typo never silently falls back to a default). `settings` merges it with the flags.
use std::path::PathBuf;

use anyhow::{Context as _, Result};
use serde::{Deserialize, Deserializer};

use crate::{kernel::Event, resolve::relabel::RuleConfig};

/// `event = "cpu-clock"`: the kernel stage's event, by the name it prints.
impl<'de> Deserialize<'de> for Event {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Event, D::Error> {
        let name = String::deserialize(deserializer)?;
        Event::ALL.into_iter().find(|e| e.name() == name).ok_or_else(|| {
            let names: Vec<&str> = Event::ALL.iter().map(|e| e.name()).collect();
            serde::de::Error::custom(format!("unknown event {name:?}: use {}", names.join(", ")))
        })
    }
}

/// `push = "url"` or `push = ["url", ...]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(one) => vec![one],
            OneOrMany::Many(many) => many,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub frequency: Option<u64>,
    pub event: Option<Event>,
    pub interval: Option<String>,
    /// "1%" of one core, or "none".
    pub cpu_budget: Option<String>,
    pub output_dir: Option<PathBuf>,
    pub flamegraphs: Option<bool>,
    pub max_keys: Option<u32>,
    pub max_stacks: Option<u32>,
    pub unwind_table_mib: Option<f64>,
    pub pids: Option<Vec<u32>>,
    pub cgroup: Option<String>,
    /// "cpu", "offcpu", "net", "faults", "alloc".
    pub events: Option<Vec<String>>,
    pub fault_period: Option<u64>,
    /// "512KiB".
    pub alloc_sample: Option<String>,
    pub alloc_max_live: Option<u32>,
    pub leak_age: Option<String>,
    pub alloc_for: Option<String>,
    /// "app=checkout,tier!=batch".
    pub alloc_pods: Option<String>,
    pub net_events: Option<Vec<String>>,
    pub offcpu_min_block: Option<String>,
    pub offcpu_max_block: Option<String>,
    pub offcpu_states: Option<Vec<String>>,
    pub offcpu_sample_ratio: Option<u32>,
    pub offcpu_max_threads: Option<u32>,
    /// Collector(s) to push to, spool and identity (see `ember-agent run --help`).
    pub push: Option<OneOrMany>,
    pub spool_dir: Option<PathBuf>,
    pub spool_max_mib: Option<f64>,
    pub agent_id: Option<String>,
    pub token_file: Option<PathBuf>,
    /// TLS and plaintext settings (see `ember-agent run --help`).
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_domain: Option<String>,
    pub plaintext: Option<bool>,
    /// OTLP profiles receiver to export to, and headers ("name=value") on every export.
    pub otlp: Option<String>,
    pub otlp_headers: Option<Vec<String>>,
    /// Status server (health, readiness, metrics) address.
    pub http: Option<std::net::SocketAddr>,
    /// Pull mode: gRPC address to serve profiles on, and how many to keep.
    pub serve: Option<std::net::SocketAddr>,
    pub keep: Option<usize>,
    /// Static labels on every shipped profile.
    pub labels: Option<std::collections::HashMap<String, String>>,
    /// Kubernetes pod metadata (auto, off, in-cluster or an API URL) and this node's name.
    pub kubernetes: Option<String>,
    pub node_name: Option<String>,
    /// Relabel rules applied to each sample's target labels, in order.
    pub relabel: Option<Vec<RuleConfig>>,
    /// Separate debug info: directories, debuginfod servers, their cache and timeout.
    pub debug_dirs: Option<Vec<PathBuf>>,
    pub debuginfod_urls: Option<Vec<String>>,
    pub debuginfod_cache: Option<PathBuf>,
    pub debuginfod_timeout: Option<String>,
    pub debug_info_mib: Option<f64>,
}

impl FileConfig {
    pub fn load(path: &std::path::Path) -> Result<FileConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        FileConfig::parse(&text, &path.display().to_string())
    }

    /// Parses a config's text; errors are one line and name `origin` and the line.
    pub fn parse(text: &str, origin: &str) -> Result<FileConfig> {
        toml::from_str(text).map_err(|e| {
            // toml's message spans lines; keep the one-line promise.
            let message = e.message().replace('\n', " ");
            let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
            anyhow::anyhow!("config {origin} line {}: {message}", line.unwrap_or(1))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_config_keys_are_one_line_errors() {
        let dir = std::env::temp_dir().join(format!("ember-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("agent.toml");
        std::fs::write(&path, "frequency = 99\nfrequncy = 3\n").unwrap();
        let error = FileConfig::load(&path).unwrap_err().to_string();
        assert!(error.contains("line 2") && error.contains("frequncy"), "{error}");
        assert!(!error.contains('\n'), "{error}");
        std::fs::write(&path, "frequency = 99\nevent = \"cpu-clock\"\ninterval = \"5s\"\n").unwrap();
        let config = FileConfig::load(&path).unwrap();
        assert_eq!(config.frequency, Some(99));
        assert_eq!(config.event, Some(Event::CpuClock));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn push_takes_one_collector_or_a_list() {
        let parse = |text: &str| toml::from_str::<FileConfig>(text).map(|c| c.push.map(OneOrMany::into_vec));
        assert_eq!(parse("push = \"http://a:7070\"").unwrap(), Some(vec!["http://a:7070".to_string()]));
        assert_eq!(parse("push = [\"http://a:7070\", \"http://b:7070\"]").unwrap().unwrap().len(), 2);
        assert!(parse("push = 7").is_err());
    }
}

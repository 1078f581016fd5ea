//! Tracepoints as this kernel describes them in tracefs: which exist, where their fields are
//! (read from each format file at start-up, never hard-coded), and the names behind
//! symbolic values such as kfree_skb's drop reasons.
use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{bail, Context as _, Result};

fn events_dir() -> PathBuf {
    for dir in ["/sys/kernel/tracing/events", "/sys/kernel/debug/tracing/events"] {
        if Path::new(dir).is_dir() {
            return PathBuf::from(dir);
        }
    }
    PathBuf::from("/sys/kernel/tracing/events")
}

/// One tracepoint's format file.
pub struct Format {
    pub name: String,
    fields: HashMap<String, (u32, u32)>,
    print_fmt: String,
}

impl Format {
    /// Reads `category:name`; an unknown tracepoint is an error that lists the ones this
    /// kernel has in that category.
    pub fn read(category: &str, name: &str) -> Result<Format> {
        let dir = events_dir().join(category).join(name);
        let text = match fs::read_to_string(dir.join("format")) {
            Ok(text) => text,
            Err(_) => bail!("{}", unknown_tracepoint(category, name)),
        };
        Ok(Format::parse(format!("{category}:{name}"), &text))
    }

    /// A format file's text: its fields' offsets and sizes, and its print format.
    pub fn parse(name: String, text: &str) -> Format {
        let mut fields = HashMap::new();
        for line in text.lines().map(str::trim).filter(|l| l.starts_with("field:")) {
            let mut parts = line.split(';').map(str::trim);
            let declaration = parts.next().unwrap_or_default().trim_start_matches("field:");
            let number = |prefix: &str, part: Option<&str>| {
                part.and_then(|p| p.strip_prefix(prefix)).and_then(|v| v.parse::<u32>().ok())
            };
            let (offset, size) = (number("offset:", parts.next()), number("size:", parts.next()));
            // "unsigned int len", "char prev_comm[16]", "__data_loc char[] name": the field
            // name is the last word, without any array suffix.
            let field = declaration.rsplit(' ').next().unwrap_or_default();
            let field = field.split('[').next().unwrap_or_default().to_string();
            if let (Some(offset), Some(size)) = (offset, size) {
                fields.insert(field, (offset, size));
            }
        }
        let print_fmt = text.lines().find_map(|l| l.strip_prefix("print fmt: ")).unwrap_or_default().to_string();
        Format { name, fields, print_fmt }
    }

    /// (offset, size) of a field.
    pub fn field(&self, name: &str) -> Result<(u32, u32)> {
        self.fields.get(name).copied().with_context(|| format!("tracepoint {} has no field {name}", self.name))
    }

    pub fn offset(&self, name: &str) -> Result<u32> {
        self.field(name).map(|(offset, _)| offset)
    }

    /// Offset of a field if the tracepoint has it.
    pub fn optional(&self, name: &str) -> Option<u32> {
        self.fields.get(name).map(|&(offset, _)| offset)
    }

    /// Value names of `__print_symbolic(REC-><field>, { 2, "NAME" }, ...)` in the print
    /// format, e.g. kfree_skb's drop reasons.
    pub fn symbols(&self, field: &str) -> HashMap<u32, String> {
        let marker = format!("__print_symbolic(REC->{field},");
        let Some(start) = self.print_fmt.find(&marker) else { return HashMap::new() };
        let mut symbols = HashMap::new();
        let mut rest = &self.print_fmt[start + marker.len()..];
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else { break };
            let entry = &rest[open + 1..open + close];
            if let Some((value, name)) = entry.split_once(',') {
                if let Ok(value) = value.trim().parse::<u32>() {
                    symbols.insert(value, name.trim().trim_matches('"').to_string());
                }
            }
            rest = &rest[open + close + 1..];
            if rest.trim_start().starts_with(')') {
                break;
            }
        }
        symbols
    }
}

/// "unknown tracepoint net:net_rx_action: this kernel's net tracepoints are net:a, net:b".
fn unknown_tracepoint(category: &str, name: &str) -> String {
    let mut present: Vec<String> = fs::read_dir(events_dir().join(category))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("format").exists())
        .map(|e| format!("{category}:{}", e.file_name().to_string_lossy()))
        .collect();
    present.sort();
    if present.is_empty() {
        format!("unknown tracepoint {category}:{name}: this kernel has no {category} tracepoints (or tracefs is not mounted)")
    } else {
        format!("unknown tracepoint {category}:{name}: this kernel's {category} tracepoints are {}", present.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sched_switch_fields_from_this_kernel() {
        let format = Format::read("sched", "sched_switch").expect("sched_switch format (needs tracefs)");
        let (_, size) = format.field("prev_state").unwrap();
        assert!(size == 4 || size == 8);
        assert!(format.offset("next_pid").unwrap() > format.offset("prev_pid").unwrap());
    }

    #[test]
    fn drop_reasons_come_from_the_print_format() {
        let format = Format::read("skb", "kfree_skb").expect("kfree_skb format");
        let reasons = format.symbols("reason");
        assert!(reasons.values().any(|r| r == "NO_SOCKET"), "{reasons:?}");
    }

    #[test]
    fn unknown_tracepoints_list_what_exists() {
        let error = Format::read("net", "net_rx_action").err().unwrap().to_string();
        assert!(error.contains("unknown tracepoint net:net_rx_action"), "{error}");
        assert!(error.contains("net:net_dev_queue"), "{error}");
        assert!(!error.contains('\n'));
    }
}

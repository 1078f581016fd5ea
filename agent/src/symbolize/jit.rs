//! Names of JIT-compiled functions, as their runtimes write them in perf maps.
use super::Frame;

/// A JIT function's frame, from the name its runtime wrote in its perf map. V8's names
/// ("JS:*hot_a /app/x.js:3:15", the mark before the name being the tier that compiled it) and
/// CPython's ("py::hot_a:/app/x.py") are split into function, file and line, so that a
/// function is one node in a flame graph whichever tier ran it. Other names are kept whole.
pub fn jit_frame(name: &str) -> Frame {
    let whole = || Frame { function: name.to_string(), file: String::new(), line: 0 };
    if let Some(rest) = name.strip_prefix("py::") {
        let (function, file) = rest.split_once(':').unwrap_or((rest, ""));
        return Frame { function: function.to_string(), file: file.to_string(), line: 0 };
    }
    let Some(rest) = ["JS:", "LazyCompile:", "Function:"].iter().find_map(|prefix| name.strip_prefix(prefix)) else {
        return whole();
    };
    let rest = rest.trim_start_matches(['~', '^', '+', '*']);
    let (function, location) = rest.split_once(' ').unwrap_or((rest, ""));
    let function = if function.is_empty() { "(anonymous)" } else { function };
    // "file:line:column", or "file:line"; the file may hold colons ("node:internal/…").
    let mut parts = location.rsplitn(3, ':');
    let (last, middle, first) = (parts.next(), parts.next(), parts.next());
    let number = |part: Option<&str>| part.and_then(|p| p.parse::<u32>().ok());
    let (file, line) = match (first, number(middle), number(last)) {
        (Some(file), Some(line), Some(_column)) => (file, line),
        _ => match (middle, number(last)) {
            (Some(_), Some(line)) => (location.rsplit_once(':').map_or(location, |(file, _)| file), line),
            _ => (location, 0),
        },
    };
    Frame { function: function.to_string(), file: file.to_string(), line }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jit_names_of_v8_and_cpython_are_split_and_others_kept_whole() {
        let frame = |f: &str, file: &str, line| Frame { function: f.into(), file: file.into(), line };
        assert_eq!(jit_frame("JS:*hot_a /tmp/split.js:3:15"), frame("hot_a", "/tmp/split.js", 3));
        assert_eq!(jit_frame("JS:~hot_a /tmp/split.js:3:15"), frame("hot_a", "/tmp/split.js", 3), "one function whatever the tier");
        assert_eq!(jit_frame("JS:~setup node:internal/process/pre_execution:478:32"), frame("setup", "node:internal/process/pre_execution", 478));
        assert_eq!(jit_frame("LazyCompile:*run /app/x.js:7"), frame("run", "/app/x.js", 7));
        assert_eq!(jit_frame("JS:^ /app/x.js:1:1"), frame("(anonymous)", "/app/x.js", 1));
        assert_eq!(jit_frame("py::Worker.hot_b:/srv/app.py"), frame("Worker.hot_b", "/srv/app.py", 0));
        assert_eq!(jit_frame("Builtin:InterpreterEntryTrampoline"), frame("Builtin:InterpreterEntryTrampoline", "", 0));
        assert_eq!(jit_frame("Interpreter"), frame("Interpreter", "", 0));
    }
}

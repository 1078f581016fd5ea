//! The merged call tree as the web UI draws it: one node per distinct path of frames, rooted
//! at the kind's root labels (the thread name, ...) like the folded view, with each frame's
//! kind (kernel, binary, library, JIT) and its source file and line where known. A diff tree
//! carries a second value per node, from the base range. Nodes are listed depth first, parents
//! before children, in columns, so that 50,000 of them stay a compact JSON document.
use ember_pprof::{FastMap, JIT_MAPPING, KERNEL_MAPPING};
use ember_proto::pprof::Profile;
use serde::Serialize;

/// What a frame is, for its colour.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum FrameKind {
    Label = 0,
    Kernel = 1,
    Binary = 2,
    Library = 3,
    Jit = 4,
}

const KIND_NAMES: [&str; 5] = ["label", "kernel", "binary", "library", "jit"];

/// One frame as the tree keys it: the same function reached by the same path is one node,
/// whatever address or line it ran at.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Frame {
    name: u32,
    kind: FrameKind,
    inlined: bool,
}

/// A frame's source position, kept only while every merged location agrees on it.
#[derive(Clone, Copy, PartialEq)]
struct Source {
    file: u32,
    line: i64,
}

struct Node {
    frame: Frame,
    source: Option<Source>,
    total: [i64; 2],
    own: [i64; 2],
    /// Children as a linked list (u32::MAX ends it): one edge map for the whole tree is far
    /// cheaper than a map per node.
    first_child: u32,
    next_sibling: u32,
}

const NONE: u32 = u32::MAX;

/// Builds the tree from one profile, or two (a diff: slot 1 holds the base's values).
pub struct TreeBuilder {
    names: Vec<String>,
    name_ids: FastMap<String, u32>,
    nodes: Vec<Node>,
    /// (parent, frame) -> child.
    edges: FastMap<(u32, Frame), u32>,
}


impl Default for TreeBuilder {
    fn default() -> Self {
        let root = Node {
            frame: Frame { name: 0, kind: FrameKind::Label, inlined: false },
            source: None,
            total: [0; 2],
            own: [0; 2],
            first_child: NONE,
            next_sibling: NONE,
        };
        let mut name_ids = FastMap::default();
        name_ids.insert("all".to_string(), 0);
        TreeBuilder { names: vec!["all".into()], name_ids, nodes: vec![root], edges: FastMap::default() }
    }
}

/// A frame of one location, with where it is in the source.
#[derive(Clone, Copy)]
struct LocationFrame {
    frame: Frame,
    source: Option<Source>,
}

impl TreeBuilder {
    fn name(&mut self, text: &str) -> u32 {
        if let Some(&id) = self.name_ids.get(text) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(text.to_string());
        self.name_ids.insert(text.to_string(), id);
        id
    }

    /// Adds the samples of `profile`, weighed by its value `value`, rooted at the string
    /// labels `roots`, into slot `slot` (0: the range shown, 1: the base of a diff).
    pub fn add(&mut self, profile: &Profile, value: usize, roots: &[&str], slot: usize) {
        let text = |i: i64| ember_pprof::string(&profile.string_table, i);
        let mapping_kinds: FastMap<u64, FrameKind> = profile.mapping.iter().map(|m| (m.id, frame_kind(text(m.filename)))).collect();
        let functions: FastMap<u64, (&str, &str)> = profile.function.iter().map(|f| (f.id, (text(f.name), text(f.filename)))).collect();
        // Each location's frames, root first, as a range of one flat list.
        let (mut frames, mut locations) = (Vec::new(), FastMap::default());
        for location in &profile.location {
            let kind = mapping_kinds.get(&location.mapping_id).copied().unwrap_or(FrameKind::Binary);
            let start = frames.len();
            // Lines are innermost first; the tree goes root to leaf.
            for (i, line) in location.line.iter().enumerate().rev() {
                let (name, file) = functions.get(&line.function_id).copied().unwrap_or(("[unknown]", ""));
                let frame = Frame { name: self.name(name), kind, inlined: i + 1 < location.line.len() };
                let source = (!file.is_empty()).then(|| Source { file: self.name(file), line: line.line });
                frames.push(LocationFrame { frame, source });
            }
            locations.insert(location.id, start..frames.len());
        }
        let root_keys: Vec<Option<i64>> = roots.iter().map(|r| profile.string_table.iter().position(|k| k == r).map(|i| i as i64)).collect();
        for sample in &profile.sample {
            let weight = sample.value.get(value).copied().unwrap_or(0);
            if weight <= 0 {
                continue;
            }
            let mut node = 0;
            self.nodes[0].total[slot] = self.nodes[0].total[slot].saturating_add(weight);
            for key in &root_keys {
                let label = sample.label.iter().find(|l| Some(l.key) == *key).map_or("", |l| text(l.str));
                let name = self.name(if label.is_empty() { "[unknown]" } else { label });
                node = self.enter(node, Frame { name, kind: FrameKind::Label, inlined: false }, None, weight, slot);
            }
            for id in sample.location_id.iter().rev() {
                for located in locations.get(id).map_or(&[][..], |range| &frames[range.clone()]) {
                    node = self.enter(node, located.frame, located.source, weight, slot);
                }
            }
            self.nodes[node as usize].own[slot] = self.nodes[node as usize].own[slot].saturating_add(weight);
        }
    }

    /// The child of `parent` for `frame` (made if new), with `weight` added to its total.
    fn enter(&mut self, parent: u32, frame: Frame, source: Option<Source>, weight: i64, slot: usize) -> u32 {
        let next = self.nodes.len() as u32;
        let child = *self.edges.entry((parent, frame)).or_insert(next);
        let node = if child == next {
            let sibling = std::mem::replace(&mut self.nodes[parent as usize].first_child, child);
            self.nodes.push(Node { frame, source, total: [0; 2], own: [0; 2], first_child: NONE, next_sibling: sibling });
            &mut self.nodes[child as usize]
        } else {
            let node = &mut self.nodes[child as usize];
            if node.source.is_some_and(|s| Some(s) != source) {
                // Locations of the same function at other lines (or files): keep the file only
                // if it is the same, else nothing.
                let known = node.source.unwrap();
                node.source = source.filter(|s| s.file == known.file).map(|s| Source { line: 0, ..s });
            }
            node
        };
        node.total[slot] = node.total[slot].saturating_add(weight);
        child
    }

    /// The tree, depth first, children heaviest first, without the nodes beyond the
    /// `max_nodes` heaviest (by the larger of their two totals): what is cut is counted.
    pub fn finish(self, max_nodes: usize, diff: bool) -> Tree {
        let weight = |n: &Node| n.total[0].max(n.total[1]);
        let threshold = if self.nodes.len() > max_nodes {
            let mut weights: Vec<i64> = self.nodes.iter().map(weight).collect();
            let (_, nth, _) = weights.select_nth_unstable_by(max_nodes - 1, |a, b| b.cmp(a));
            *nth
        } else {
            i64::MIN
        };
        let mut tree = Tree { names: Vec::new(), kinds: KIND_NAMES, diff, cut_nodes: 0, nodes: Columns::default() };
        let mut stack = vec![(0usize, 0u32)];
        let mut kept = 0;
        while let Some((index, depth)) = stack.pop() {
            let node = &self.nodes[index];
            // Ties at the threshold are kept in order until the budget is spent.
            if index != 0 && (weight(node) < threshold || kept >= max_nodes) {
                continue;
            }
            kept += 1;
            let columns = &mut tree.nodes;
            columns.name.push(node.frame.name);
            columns.kind.push(node.frame.kind as u8);
            columns.inlined.push(u8::from(node.frame.inlined));
            columns.depth.push(depth);
            columns.total.push(node.total[0]);
            columns.own.push(node.own[0]);
            columns.file.push(node.source.map_or(u32::MAX, |s| s.file));
            columns.line.push(node.source.map_or(0, |s| s.line));
            if diff {
                columns.base_total.push(node.total[1]);
                columns.base_own.push(node.own[1]);
            }
            let mut children = Vec::new();
            let mut child = node.first_child;
            while child != NONE {
                children.push(child as usize);
                child = self.nodes[child as usize].next_sibling;
            }
            // Popped heaviest first; names break ties so that the layout is stable.
            children.sort_by(|&a, &b| {
                let (a, b) = (&self.nodes[a], &self.nodes[b]);
                weight(a).cmp(&weight(b)).then_with(|| self.names[b.frame.name as usize].cmp(&self.names[a.frame.name as usize]))
            });
            stack.extend(children.into_iter().map(|c| (c, depth + 1)));
        }
        tree.cut_nodes = self.nodes.len() - kept;
        tree.names = self.names;
        tree
    }
}

fn frame_kind(mapping: &str) -> FrameKind {
    let file = mapping.rsplit('/').next().unwrap_or(mapping);
    if mapping == KERNEL_MAPPING {
        FrameKind::Kernel
    } else if mapping == JIT_MAPPING {
        FrameKind::Jit
    } else if file.contains(".so") || file.starts_with("[vdso") {
        FrameKind::Library
    } else {
        FrameKind::Binary
    }
}

/// Node columns, one entry per node. `file` is an index into `names` (u32::MAX: unknown),
/// `line` 0 where unknown or not one line.
#[derive(Default, Serialize)]
pub struct Columns {
    pub name: Vec<u32>,
    pub kind: Vec<u8>,
    pub inlined: Vec<u8>,
    pub depth: Vec<u32>,
    pub total: Vec<i64>,
    #[serde(rename = "self")]
    pub own: Vec<i64>,
    pub file: Vec<u32>,
    pub line: Vec<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub base_total: Vec<i64>,
    #[serde(skip_serializing_if = "Vec::is_empty", rename = "base_self")]
    pub base_own: Vec<i64>,
}

#[derive(Serialize)]
pub struct Tree {
    /// Function, label and file names; nodes refer to them by index.
    pub names: Vec<String>,
    /// Names of the values of `nodes.kind`.
    pub kinds: [&'static str; 5],
    pub diff: bool,
    /// Nodes left out beyond the size limit (the lightest).
    pub cut_nodes: usize,
    pub nodes: Columns,
}

#[cfg(test)]
mod tests {
    use ember_proto::pprof::{Function, Label, Line, Location, Mapping, Sample};

    use super::*;

    /// main -> a (inlined into main) and main -> b, in a binary and libc; comm "app".
    fn profile() -> Profile {
        let strings = ["", "main", "a", "b", "/bin/app", "/lib/libc.so.6", "comm", "app", "app.c", "memcpy"];
        let location = |id: u64, mapping_id: u64, lines: &[(u64, i64)]| Location {
            id,
            mapping_id,
            line: lines.iter().map(|&(function_id, line)| Line { function_id, line, column: 0 }).collect(),
            ..Default::default()
        };
        let sample = |locations: &[u64], value: i64| Sample {
            location_id: locations.to_vec(),
            value: vec![value],
            label: vec![Label { key: 6, str: 7, ..Default::default() }],
        };
        Profile {
            string_table: strings.map(String::from).to_vec(),
            mapping: vec![Mapping { id: 1, filename: 4, ..Default::default() }, Mapping { id: 2, filename: 5, ..Default::default() }],
            function: (1..=4)
                .map(|id| Function { id, name: [1, 2, 3, 9][id as usize - 1], filename: 8, ..Default::default() })
                .collect(),
            location: vec![location(1, 1, &[(2, 20), (1, 10)]), location(2, 1, &[(3, 30)]), location(3, 1, &[(1, 11)]), location(4, 2, &[(4, 0)])],
            // a inlined in main (7), memcpy called by b called by main (3), main alone (1).
            sample: vec![sample(&[1], 7), sample(&[4, 2, 3], 3), sample(&[3], 1)],
            ..Default::default()
        }
    }

    fn named(tree: &Tree) -> Vec<(String, u32, i64, i64)> {
        let n = &tree.nodes;
        (0..n.name.len()).map(|i| (tree.names[n.name[i] as usize].clone(), n.depth[i], n.total[i], n.own[i])).collect()
    }

    #[test]
    fn paths_merge_into_nodes_depth_first_heaviest_first() {
        let mut builder = TreeBuilder::default();
        builder.add(&profile(), 0, &["comm"], 0);
        let tree = builder.finish(100, false);
        let expected = [("all", 0, 11, 0), ("app", 1, 11, 0), ("main", 2, 11, 1), ("a", 3, 7, 7), ("b", 3, 3, 0), ("memcpy", 4, 3, 3)];
        assert_eq!(named(&tree), expected.map(|(s, d, t, o)| (s.to_string(), d, t, o)));
        let n = &tree.nodes;
        assert_eq!((n.kind[1], n.kind[2], n.kind[5]), (FrameKind::Label as u8, FrameKind::Binary as u8, FrameKind::Library as u8));
        assert_eq!(n.inlined[3], 1, "a is inlined into main");
        // main ran at lines 10 and 11: the file stays, the line does not; b has one line.
        assert_eq!((tree.names[n.file[2] as usize].as_str(), n.line[2]), ("app.c", 0));
        assert_eq!(n.line[4], 30);
        assert_eq!(tree.cut_nodes, 0);
    }

    #[test]
    fn a_diff_holds_both_ranges_and_the_limit_cuts_the_lightest() {
        let mut builder = TreeBuilder::default();
        builder.add(&profile(), 0, &["comm"], 0);
        let mut base = profile();
        base.sample.truncate(1);
        builder.add(&base, 0, &["comm"], 1);
        let tree = builder.finish(4, true);
        // b and memcpy (3) are the lightest of six.
        assert_eq!(named(&tree).into_iter().map(|n| n.0).collect::<Vec<_>>(), ["all", "app", "main", "a"]);
        assert_eq!(tree.nodes.base_total, [7, 7, 7, 7]);
        assert_eq!(tree.cut_nodes, 2);
    }
}

//! `ember-agent unwind-table`: prints the unwind table Ember builds for a binary, as a summary
//! (rows by rule, build time) or row by row, in `readelf --debug-dump=frames-interp` terms, so
//! that a truncated stack can be traced to the rule that stopped it.
use std::{collections::BTreeMap, time::Instant};

use anyhow::Result;

use crate::{
    cli::UnwindTableArgs,
    unwind::{self, Rule},
};

pub fn print(args: &UnwindTableArgs) -> Result<()> {
    for path in &args.files {
        let started = Instant::now();
        let table = unwind::table_of_file(path)?;
        if args.rows {
            for row in &table.rows {
                println!("{:016x} {}", row.address, describe(row.rule));
            }
            continue;
        }
        let mut by_rule: BTreeMap<&str, usize> = BTreeMap::new();
        for row in &table.rows {
            *by_rule.entry(kind(row.rule)).or_default() += 1;
        }
        let kinds: Vec<String> = by_rule.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        let (rows, source) = (table.rows.len(), table.source);
        let compact = unwind::CompactTable::of(table)?;
        let elapsed = started.elapsed();
        println!(
            "{}: {rows} rows from {source} in {:.1} ms ({}); in the kernel: {} rows, {} pages, {:.1} KiB",
            path.display(),
            elapsed.as_secs_f64() * 1e3,
            kinds.join(", "),
            compact.rows.len(),
            compact.pages.len(),
            compact.kernel_bytes() as f64 / 1024.0
        );
    }
    Ok(())
}

fn kind(rule: Rule) -> &'static str {
    match rule {
        Rule::Frame { .. } => "frame",
        Rule::Outermost => "outermost",
        Rule::Plt { .. } => "plt",
        Rule::Signal => "signal",
        Rule::NoInfo => "no-info",
        Rule::Unsupported(_) => "unsupported",
    }
}

/// "rsp+16 rbp=c-16", the way readelf writes a row's CFA and rbp columns.
fn describe(rule: Rule) -> String {
    match rule {
        Rule::Frame { cfa_is_rbp, cfa_offset, rbp_offset } => {
            let base = if cfa_is_rbp { "rbp" } else { "rsp" };
            let rbp = if rbp_offset == 0 { "u".to_string() } else { format!("c{rbp_offset:+}") };
            format!("{base}{cfa_offset:+} rbp={rbp}")
        }
        Rule::Unsupported(why) => format!("unsupported({why:?})"),
        other => kind(other).to_string(),
    }
}

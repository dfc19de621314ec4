//! The report: Markdown tables that read well in a terminal too, and the targets met or missed.

use std::{fmt::Write, time::Duration};

/// A titled Markdown table with aligned columns.
pub struct Table {
    title: String,
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(title: impl Into<String>, header: &[&'static str]) -> Self {
        Self { title: title.into(), header: header.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len(), "a row of {:?} has a cell per column", self.title);
        self.rows.push(cells);
    }

    fn render(&self, out: &mut String) {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|column| {
                let cells = self.rows.iter().map(|row| row[column].chars().count());
                cells.chain([self.header[column].chars().count()]).max().unwrap_or(0)
            })
            .collect();
        let line = |out: &mut String, cells: &mut dyn Iterator<Item = String>| {
            for (cell, width) in cells.zip(&widths) {
                let pad = width - cell.chars().count();
                let _ = write!(out, "| {cell}{} ", " ".repeat(pad));
            }
            out.push_str("|\n");
        };
        let _ = writeln!(out, "### {}\n", self.title);
        line(out, &mut self.header.iter().map(|cell| (*cell).to_owned()));
        line(out, &mut widths.iter().map(|width| "-".repeat(*width)));
        for row in &self.rows {
            line(out, &mut row.iter().cloned());
        }
        out.push('\n');
    }
}

/// One target of the issue, with what was measured against it.
pub struct Verdict {
    pub what: String,
    pub target: String,
    pub measured: String,
    pub met: bool,
}

/// The whole report: the machine, every table, then the targets.
pub fn render(machine: &[(&str, String)], tables: &[Table], verdicts: &[Verdict]) -> String {
    let mut out = String::from("## cri-imaged versus containerd directly\n\n");
    for (key, value) in machine {
        let _ = writeln!(out, "- {key}: {value}");
    }
    out.push('\n');
    for table in tables {
        table.render(&mut out);
    }
    let mut targets = Table::new("Targets", &["what", "target", "measured", "verdict"]);
    for verdict in verdicts {
        // A debug build only proves the bench runs; its figures judge nothing.
        let met = match (cfg!(debug_assertions), verdict.met) {
            (true, _) => "n/a (debug build)",
            (false, true) => "met",
            (false, false) => "MISSED",
        };
        targets.row(vec![verdict.what.clone(), verdict.target.clone(), verdict.measured.clone(), met.into()]);
    }
    targets.render(&mut out);
    out
}

/// A latency in the unit that keeps three digits.
/// A run's p50, p99 and requests a second, as table cells.
pub fn latency_cells(run: &crate::load::Run) -> [String; 3] {
    [micros(run.quantile_us(0.5)), micros(run.quantile_us(0.99)), format!("{:.0}", run.requests_per_second())]
}

/// A side's row at `concurrency`: its path, [`latency_cells`], and its p50 over each baseline's.
pub fn side_row(
    concurrency: usize,
    path: &str,
    run: &crate::load::Run,
    baselines: &[&crate::load::Run],
) -> Vec<String> {
    let mut row = vec![concurrency.to_string(), path.to_owned()];
    row.extend(latency_cells(run));
    row.extend(baselines.iter().map(|base| ratio(run.quantile_us(0.5).into(), base.quantile_us(0.5).into())));
    row
}

pub fn micros(us: u32) -> String {
    if us < 10_000 { format!("{us} µs") } else { format!("{:.1} ms", f64::from(us) / 1000.0) }
}

pub fn duration(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
    } else {
        format!("{:.2} s", duration.as_secs_f64())
    }
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

pub fn ratio(numerator: f64, denominator: f64) -> String {
    format!("{:.2}", numerator / denominator)
}

//! Tables as kubectl and crictl print them: a header in capitals, columns two spaces apart, no
//! borders, one row per line (so that `awk` can read them). On a terminal, one column (the
//! image's name) is cut in the middle to fit its width; never with `-o wide`. Cells are measured
//! and cut as they will be shown ([`printable`]), so columns line up whatever the daemon's text
//! holds.

use super::{
    human::cut_middle,
    line::{Line, printable},
};

pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&'static str]) -> Self {
        Self { header: header.to_vec(), rows: Vec::new() }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells.iter().map(|cell| printable(cell)).collect());
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The lines, each at most `width` characters if given (by cutting column `squeeze`, down to
    /// 12 characters at least).
    pub fn lines(&self, width: Option<usize>, squeeze: usize) -> Vec<Line> {
        let columns = self.header.len();
        let mut widths: Vec<usize> = self.header.iter().map(|title| title.chars().count()).collect();
        for row in &self.rows {
            for (column, cell) in row.iter().enumerate().take(columns) {
                widths[column] = widths[column].max(cell.chars().count());
            }
        }
        if let Some(width) = width {
            let total: usize = widths.iter().sum::<usize>() + 2 * columns.saturating_sub(1);
            if total > width && squeeze < columns {
                let others = total - widths[squeeze];
                widths[squeeze] = width.saturating_sub(others).max(12).min(widths[squeeze]);
            }
        }
        let line = |cells: Vec<String>| {
            let last = cells.len().saturating_sub(1);
            let mut line = String::new();
            for (column, cell) in cells.into_iter().enumerate() {
                let cell = if column == squeeze { cut_middle(&cell, widths[column]) } else { cell };
                if column == last {
                    line.push_str(&cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[column]));
                }
            }
            Line::plain(line.trim_end())
        };
        let header = line(self.header.iter().map(|title| (*title).to_owned()).collect());
        std::iter::once(header).chain(self.rows.iter().map(|row| line(row.clone()))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(lines: Vec<Line>) -> Vec<String> {
        lines.iter().map(Line::text).collect()
    }

    #[test]
    fn columns_line_up_two_spaces_apart_under_capital_headers() {
        let mut table = Table::new(&["IMAGE", "SIZE"]);
        table.row(vec!["busybox:latest".to_owned(), "2.20 MB".to_owned()]);
        table.row(vec!["a:1".to_owned(), "10 B".to_owned()]);
        assert_eq!(
            texts(table.lines(None, 0)),
            ["IMAGE           SIZE", "busybox:latest  2.20 MB", "a:1             10 B"]
        );
    }

    #[test]
    fn on_a_narrow_terminal_only_the_named_column_is_cut() {
        let mut table = Table::new(&["IMAGE", "ID"]);
        table.row(vec!["registry.example.com/a/very/long/name:tag".to_owned(), "0123456789ab".to_owned()]);
        let lines = texts(table.lines(Some(30), 0));
        assert!(lines.iter().all(|line| line.chars().count() <= 30), "{lines:#?}");
        assert!(lines[1].ends_with("0123456789ab") && lines[1].contains('…'), "{lines:#?}");
        let wide = texts(table.lines(None, 0));
        assert!(wide[1].starts_with("registry.example.com/a/very/long/name:tag"));
    }

    #[test]
    fn a_column_lines_up_under_text_with_control_characters_shown() {
        let mut table = Table::new(&["POD", "IMAGE"]);
        table.row(vec!["a\x1b[2Jb".to_owned(), "x:1".to_owned()]);
        table.row(vec!["c".to_owned(), "y:1".to_owned()]);
        assert_eq!(texts(table.lines(None, 1)), ["POD          IMAGE", "a\\u{1b}[2Jb  x:1", "c            y:1"]);
    }
}

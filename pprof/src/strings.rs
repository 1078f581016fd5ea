//! pprof's string table: every string once, referred to by index; index 0 is "".
use crate::FastMap;

/// The string at `index` of a string table; "" for an index out of range (a decoded profile's
/// indexes are checked, but a view must not panic on a merge of hostile ones).
pub fn string(table: &[String], index: i64) -> &str {
    usize::try_from(index).ok().and_then(|i| table.get(i)).map_or("", String::as_str)
}

#[derive(Default)]
pub struct StringIndex(FastMap<String, i64>);

impl StringIndex {
    /// Index of `s` in `table`, appending it the first time.
    pub fn intern(&mut self, table: &mut Vec<String>, s: &str) -> i64 {
        if let Some(&i) = self.0.get(s) {
            return i;
        }
        let i = table.len() as i64;
        table.push(s.to_string());
        self.0.insert(s.to_string(), i);
        i
    }
}

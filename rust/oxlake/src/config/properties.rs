//! The `.properties` text format as `java.util.Properties` reads and writes it.
//!
//! Apache Hudi's Java engine rewrites `hoodie.properties` with `Properties.store`, which escapes
//! `=`, `:`, `#`, `!`, `\`, leading spaces, control characters and every non-ASCII character
//! (`\uXXXX`). oxlake reads every escape `Properties.load` accepts, so a file Java touched opens.
//! oxlake itself writes values as they are (hudi-rs decodes no escapes) and escapes only what would
//! otherwise change meaning: a backslash, a line break, a leading space, a separator in a key, and
//! characters Java would not read from its ISO-8859-1 text (oxlake's own values are ASCII).

use std::collections::BTreeMap;

/// The text of a properties file: UTF-8 when it is, else ISO-8859-1 (what `Properties.load` reads
/// from a byte stream; Java's `store` escapes everything else, so its files are ASCII).
pub fn decode(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(_) => bytes.iter().map(|&b| char::from(b)).collect(),
    }
}

/// The properties of `text`, as `Properties.load` reads them: comment lines (`#`, `!`), logical
/// lines continued by an odd number of trailing backslashes, a key ending at the first unescaped
/// `=`, `:` or whitespace, and the escapes `\t \n \r \f \uXXXX` (a `\` before any other character
/// stands for that character). A later key wins.
pub fn load(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in logical_lines(text) {
        let (key, value) = split_key(&line);
        out.insert(unescape(key), unescape(value));
    }
    out
}

/// Natural lines joined into logical ones, comments and blank lines dropped; the backslash that
/// continues a line and the continuation's leading whitespace are removed.
fn logical_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    let text = text.replace("\r\n", "\n");
    for natural in text.split(['\n', '\r']) {
        let continuing = current.is_some();
        let line = natural.trim_start_matches(is_blank);
        if !continuing && (line.is_empty() || line.starts_with('#') || line.starts_with('!')) {
            continue;
        }
        let trailing = line.chars().rev().take_while(|&c| c == '\\').count();
        let (body, continues) = match trailing % 2 {
            1 => (&line[..line.len() - 1], true),
            _ => (line, false),
        };
        let mut joined = current.take().unwrap_or_default();
        joined.push_str(body);
        if continues {
            current = Some(joined);
        } else {
            out.push(joined);
        }
    }
    // A file ending in a continuation: what was read counts, as in Java.
    out.extend(current);
    out
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\x0c')
}

/// The raw (still escaped) key and value of a logical line.
fn split_key(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || is_blank(c) {
            end = i;
            break;
        }
    }
    let key = &line[..end];
    let rest = line[end..].trim_start_matches(is_blank);
    let rest = rest.strip_prefix(['=', ':']).unwrap_or(rest);
    (key, rest.trim_start_matches(is_blank))
}

/// Decodes the escapes of a key or value. A malformed `\u` escape (Java throws) keeps its text.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut units: Vec<u16> = Vec::new();
    let mut chars = s.chars().peekable();
    let flush = |units: &mut Vec<u16>, out: &mut String| {
        out.extend(char::decode_utf16(units.drain(..)).map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER)));
    };
    while let Some(c) = chars.next() {
        if c != '\\' {
            flush(&mut units, &mut out);
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('u') => {
                let hex: String = chars.clone().take(4).collect();
                match (hex.len() == 4).then(|| u16::from_str_radix(&hex, 16).ok()).flatten() {
                    // UTF-16 units: a surrogate pair spans two escapes.
                    Some(unit) => {
                        units.push(unit);
                        for _ in 0..4 {
                            chars.next();
                        }
                    }
                    None => {
                        flush(&mut units, &mut out);
                        out.push_str("\\u");
                    }
                }
            }
            other => {
                flush(&mut units, &mut out);
                match other {
                    Some('t') => out.push('\t'),
                    Some('n') => out.push('\n'),
                    Some('r') => out.push('\r'),
                    Some('f') => out.push('\x0c'),
                    Some(c) => out.push(c),
                    None => {}
                }
            }
        }
    }
    flush(&mut units, &mut out);
    out
}

/// `text` with each `(key, value)` set (appended) or, for `None`, removed; every other line (a
/// comment, another property, its escapes and continuations) kept byte for byte.
pub fn edit(text: &str, edits: &[(&str, Option<&str>)]) -> String {
    let edited = |raw_key: &str| edits.iter().any(|(k, _)| unescape(raw_key) == *k);
    let mut out = String::with_capacity(text.len());
    let mut dropping = false;
    let mut continuing = false;
    for natural in text.split_inclusive('\n') {
        let body = natural.trim_end_matches(['\n', '\r']);
        let line = body.trim_start_matches(is_blank);
        let starts = !(continuing || line.is_empty() || line.starts_with('#') || line.starts_with('!'));
        if starts {
            dropping = edited(split_key(line).0);
        }
        if !(dropping && (starts || continuing)) {
            out.push_str(natural);
        }
        continuing = (starts || continuing) && line.chars().rev().take_while(|&c| c == '\\').count() % 2 == 1;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for (key, value) in edits {
        if let Some(value) = value {
            out.push_str(&line(key, value));
            out.push('\n');
        }
    }
    out
}

/// One `key=value` line as oxlake writes it (see the module comment).
pub fn line(key: &str, value: &str) -> String {
    let mut out = escape(key, true);
    out.push('=');
    out.push_str(&escape(value, false));
    out
}

fn escape(s: &str, is_key: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for (i, c) in s.chars().enumerate() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0c' => out.push_str("\\f"),
            ' ' if is_key || i == 0 => out.push_str("\\ "),
            '=' | ':' if is_key => {
                out.push('\\');
                out.push(c);
            }
            '#' | '!' if is_key && i == 0 => {
                out.push('\\');
                out.push(c);
            }
            // Java reads the file as ISO-8859-1: anything else as UTF-16 escapes.
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04X}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `Properties.store`'s escaping (its `saveConvert`, with `escUnicode` as for a byte stream),
    /// written from the rules of `java.util.Properties`' documentation.
    fn java_store(props: &BTreeMap<String, String>) -> String {
        fn convert(s: &str, is_key: bool) -> String {
            let mut out = String::new();
            for (i, c) in s.chars().enumerate() {
                match c {
                    ' ' if i == 0 || is_key => out.push_str("\\ "),
                    '\t' => out.push_str("\\t"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\x0c' => out.push_str("\\f"),
                    '=' | ':' | '#' | '!' | '\\' => {
                        out.push('\\');
                        out.push(c);
                    }
                    c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                        let mut buf = [0u16; 2];
                        for unit in c.encode_utf16(&mut buf) {
                            out.push_str(&format!("\\u{unit:04X}"));
                        }
                    }
                    c => out.push(c),
                }
            }
            out
        }
        let mut out = String::from("#Updated at 2026-11-23T19:00:00Z\n#Mon Nov 23 19:00:00 UTC 2026\n");
        for (k, v) in props {
            out.push_str(&format!("{}={}\n", convert(k, true), convert(v, false)));
        }
        out
    }

    #[test]
    fn a_file_java_rewrote_reads_the_same_values() {
        let text = "#Properties saved\n\
                    hoodie.table.name=trips\n\
                    oxlake.table.arrow.schema=/////w\\=\\=\n\
                    hoodie.table.create.schema={\"type\"\\:\"record\"}\n\
                    hoodie.datasource.write.partitionpath.urlencode=false\n\
                    name\\ with\\ spaces = caf\\u00E9 \\u00FC\\uD83D\\uDE00\n";
        let props = load(text);
        assert_eq!(props["hoodie.table.name"], "trips");
        assert_eq!(props["oxlake.table.arrow.schema"], "/////w==");
        assert_eq!(props["hoodie.table.create.schema"], "{\"type\":\"record\"}");
        assert_eq!(props["name with spaces"], "café ü😀");
    }

    #[test]
    fn a_latin1_file_reads_as_java_reads_it() {
        assert_eq!(load(&decode(b"name=caf\xe9\n"))["name"], "café");
        assert_eq!(load(&decode("name=café\n".as_bytes()))["name"], "café");
    }

    #[test]
    fn separators_continuations_and_comments_follow_java() {
        let text = "  ! a comment\n\
                    key1 value one\n\
                    key2:value2\n\
                    key3\t=  \\  lead\n\
                    long = first, \\\n    second\n\
                    even=ends in a backslash\\\\\n\
                    empty\n\
                    tabbed\\tkey=v\\x\r\n\
                    # last";
        let props = load(text);
        assert_eq!(props["key1"], "value one");
        assert_eq!(props["key2"], "value2");
        assert_eq!(props["key3"], "  lead");
        assert_eq!(props["long"], "first, second");
        assert_eq!(props["even"], "ends in a backslash\\");
        assert_eq!(props["empty"], "");
        assert_eq!(props["tabbed\tkey"], "vx");
        assert_eq!(props.len(), 7);
    }

    #[test]
    fn an_edit_keeps_every_other_line_as_it_was() {
        let text = "#Saved by Java\r\nhoodie.table.name=t\r\nlong=a,\\\n  b\nhoodie.table.metadata.partitions\\=x=1\nmeta\\u0020key = 2\n";
        let out = edit(text, &[("long", None), ("meta key", Some("3")), ("new", Some("v"))]);
        assert_eq!(
            out,
            "#Saved by Java\r\nhoodie.table.name=t\r\nhoodie.table.metadata.partitions\\=x=1\nmeta\\ key=3\nnew=v\n"
        );
        assert_eq!(load(&out)["hoodie.table.metadata.partitions=x"], "1");
    }

    proptest! {
        /// Whatever Java's `store` writes, oxlake reads the same properties back.
        #[test]
        fn what_java_stores_reads_back(props in prop::collection::btree_map("\\PC{1,12}", "\\PC{0,24}|[ =:#!\\\\\t\n]{0,6}", 0..8)) {
            prop_assert_eq!(load(&java_store(&props)), props);
        }

        /// What oxlake writes reads back in oxlake (and in Java: its escapes are a subset of Java's).
        #[test]
        fn what_oxlake_writes_reads_back(props in prop::collection::btree_map("\\PC{1,12}", "\\PC{0,24}|[ =:#!\\\\\t\n]{0,6}", 0..8)) {
            let text: String = props.iter().map(|(k, v)| line(k, v) + "\n").collect();
            prop_assert_eq!(load(&text), props);
        }
    }
}

//! Reading a large state's `resources` on several threads (issue 20: the parse is half
//! of a 1,000-machine plan's work on the main thread, and nothing else can start before
//! it ends).
//!
//! The `resources` object is cut between two of its records, and each run of records is
//! parsed on a thread of its own while the calling thread parses the rest of the file
//! with the last run. Where to cut is only guessed (a comma followed by the indentation
//! the first record has, then a quote); the guess is then proven by the parse itself:
//! a run that does not end exactly between two records of `resources` does not parse as
//! a whole JSON object. Whatever does not go to plan gives `None`, and the caller parses
//! the file in one piece as before, which also names any error by line and column. The
//! result is therefore exactly the one-piece parse's, repeated addresses included.

use super::by_hand::Entries;
use super::{ResourceRecord, StateFile};

/// Below this many bytes the file is parsed in one piece (a 100-machine state is about
/// 160 kB; starting a thread costs tens of microseconds).
pub(super) const SPLIT_FROM: usize = 256 * 1024;

/// Parses `text` with its `resources` cut into up to `parts` runs, `parts - 1` of them
/// on threads of their own. `None` when the file cannot be cut (no `resources` object
/// at the top level, no pretty-printed records, too few records) or any run fails to
/// parse: the caller then parses it in one piece.
pub(super) fn parse(text: &str, parts: usize) -> Option<StateFile> {
    let open = resources_open(text)?;
    let cuts = cuts(text, open, parts);
    let (&last, _) = cuts.split_last()?;
    // The calling thread's part: the file with the runs before the last cut left out.
    let mut rest = String::with_capacity(open + 1 + text.len() - last);
    rest.push_str(&text[..=open]);
    rest.push_str(&text[last + 1..]);
    let starts = std::iter::once(open + 1).chain(cuts.iter().map(|c| c + 1));
    let runs: Vec<&str> = starts.zip(cuts.iter()).map(|(s, &e)| &text[s..e]).collect();
    let (head, state) = std::thread::scope(|s| {
        let threads: Vec<_> = runs
            .iter()
            .map(|run| std::thread::Builder::new().spawn_scoped(s, move || parse_run(run)))
            .collect();
        let state = serde_json::from_str::<StateFile>(&rest).ok();
        // A thread that could not be started leaves its run unread: one piece then.
        let head: Option<Vec<_>> = threads
            .into_iter()
            .map(|t| {
                t.ok()?
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
            .collect();
        (head, state)
    });
    let (head, mut state) = (head?, state?);
    let last_run = std::mem::take(&mut state.resources);
    // In file order, so a repeated address keeps its last record, as in one piece.
    state.resources = head.into_iter().flatten().chain(last_run).collect();
    Some(state)
}

/// Parses one run of records. It is wrapped as `[{run}]` so that its records sit as
/// deep as they do in the file (`{"resources": {run}}`): serde_json's nesting limit then
/// refuses exactly what it refuses in one piece.
fn parse_run(run: &str) -> Option<Vec<(String, ResourceRecord)>> {
    let mut wrapped = String::with_capacity(run.len() + 4);
    wrapped.push_str("[{");
    wrapped.push_str(run);
    wrapped.push_str("}]");
    let (Entries(entries),) = serde_json::from_str::<(Entries<ResourceRecord>,)>(&wrapped).ok()?;
    Some(entries)
}

/// The index of the `{` that opens the top-level `resources` object, found by reading
/// the top-level object's keys (strings and nesting followed exactly, so a `resources`
/// inside a string or a nested object is not taken). `None` when the file is not an
/// object, has no such key spelled plainly, or its value is not an object.
fn resources_open(text: &str) -> Option<usize> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, 0);
    if b.get(i) != Some(&b'{') {
        return None;
    }
    i += 1;
    let mut depth = 1usize;
    while i < b.len() {
        match b[i] {
            b'"' => {
                let end = string_end(b, i)?;
                if depth == 1 {
                    let colon = skip_ws(b, end + 1);
                    if b.get(colon) == Some(&b':') && &b[i + 1..end] == b"resources" {
                        let value = skip_ws(b, colon + 1);
                        return (b.get(value) == Some(&b'{')).then_some(value);
                    }
                }
                i = end + 1;
            }
            b'{' | b'[' => {
                depth += 1;
                i += 1;
            }
            b'}' | b']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return None;
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    None
}

/// The index of the quote closing the string that opens at `start`.
fn string_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return Some(i),
            _ => i += 1,
        }
    }
    None
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while matches!(b.get(i), Some(b' ' | b'\n' | b'\r' | b'\t')) {
        i += 1;
    }
    i
}

/// Up to `parts - 1` places to cut `resources` (the index of a comma between two of
/// its records), spread evenly over the file and increasing. A place is a comma
/// followed by the whitespace that precedes the first record (which must hold a line
/// break: a file written on one line is not cut) and a quote.
fn cuts(text: &str, open: usize, parts: usize) -> Vec<usize> {
    let b = text.as_bytes();
    let first = skip_ws(b, open + 1);
    let indent = &text[open + 1..first];
    if b.get(first) != Some(&b'"') || !indent.contains('\n') {
        return Vec::new();
    }
    let after = |comma: usize| {
        let rest = &b[comma + 1..];
        rest.starts_with(indent.as_bytes()) && rest.get(indent.len()) == Some(&b'"')
    };
    let span = text.len() - open;
    // Not sized by `parts`: a huge count must not reserve memory it will never fill.
    let mut cuts = Vec::new();
    let mut from = first;
    for k in 1..parts.max(1) {
        // Bytes, not `str`: the even spot may fall inside a character; a comma cannot.
        let target = (open + span * k / parts).max(from);
        match (target..b.len()).find(|&i| b[i] == b',' && after(i)) {
            Some(comma) => {
                cuts.push(comma);
                from = comma + 1 + indent.len();
            }
            None => break,
        }
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{JsonText, MachineRecord};

    fn record(i: usize) -> ResourceRecord {
        let mut r = ResourceRecord::new(MachineRecord {
            kind: "launch".into(),
            // A string holding what a cut looks for, escaped as JSON must.
            state: JsonText::encode(&serde_json::json!({
                "state": "ready", "note": format!(",\n    \"x{i}\": {{ é ✓ 東京"), "n": [i, i + 1],
            }))
            .unwrap(),
            label: "ready".into(),
            updated_at: "2026-12-01T10:00:00Z".parse().unwrap(),
        });
        r.push_event_at("2026-12-01T10:00:01Z".parse().unwrap(), "created");
        r.extra.insert("future".into(), serde_json::json!({"k": i}));
        r
    }

    fn state(n: usize) -> StateFile {
        let mut s = StateFile::new();
        for i in 0..n {
            s.resources.insert(format!("vm.m{i:04}"), record(i));
        }
        s.shared.insert("shared.docker.ssh_key".into(), record(n));
        s.extra.insert(
            "later".into(),
            serde_json::json!({"resources": {"vm.x": 1}}),
        );
        s
    }

    fn text(s: &StateFile) -> String {
        String::from_utf8(crate::state::to_json_bytes(s).unwrap()).unwrap()
    }

    /// Cut into any number of runs, the state reads as it does in one piece.
    #[test]
    fn a_state_cut_into_runs_reads_as_in_one_piece() {
        let t = text(&state(300));
        let one: StateFile = serde_json::from_str(&t).unwrap();
        assert_eq!(one.resources.len(), 300);
        // Many counts, so that some even spots fall inside a character of the notes.
        for parts in (2..=40).chain([64, 301]) {
            let cut = parse(&t, parts).expect("cut");
            assert_eq!(cut, one, "{parts} parts");
        }
        assert_eq!(cuts(&t, resources_open(&t).unwrap(), 4).len(), 3);
    }

    /// A repeated address keeps its last record when its two records fall in different
    /// runs, as in one piece.
    #[test]
    fn a_repeated_address_in_two_runs_keeps_the_last() {
        let t = text(&state(200));
        let at = t.rfind("\"vm.m0190\": {").unwrap();
        let t = format!("{}\"vm.m0003\": {{\"machine\": {{\"kind\": \"teardown\", \"state\": {{}}, \"label\": \"again\", \"updated_at\": \"2026-12-01T10:00:00Z\"}}}},\n    {}", &t[..at], &t[at..]);
        let one: StateFile = serde_json::from_str(&t).unwrap();
        assert_eq!(one.resources["vm.m0003"].machine.label, "again");
        let cut = parse(&t, 2).expect("cut");
        assert!(
            cuts(&t, resources_open(&t).unwrap(), 2)[0] < at,
            "the two fall apart"
        );
        assert_eq!(cut, one);
    }

    /// A file that cannot be cut, or whose runs do not all parse, gives `None` (the
    /// caller then reads it in one piece and names any error).
    #[test]
    fn what_cannot_be_cut_or_parsed_gives_none() {
        let s = state(50);
        let t = text(&s);
        // Written on one line: nothing to cut at.
        assert!(parse(&serde_json::to_string(&s).unwrap(), 2).is_none());
        assert!(parse(&t, 2).is_some());
        // A broken record in the first run, in the last one, and in `shared`.
        let bad = t.replacen("\"label\": \"ready\"", "\"label\": ready", 1);
        assert!(parse(&bad, 2).is_none());
        let last = t.find("\"vm.m0049\": {").unwrap();
        let at = last + t[last..].find("\"label\": \"ready\"").unwrap();
        let bad = format!("{}\"label\": 7{}", &t[..at], &t[at + 16..]);
        assert!(parse(&bad, 2).is_none());
        let at = t.rfind("\"label\": \"ready\"").unwrap();
        assert!(at > t.find("\"shared\"").unwrap());
        let bad = format!("{}\"label\": 7{}", &t[..at], &t[at + 16..]);
        assert!(parse(&bad, 2).is_none());
        // `resources` given twice (once spelled with an escape): refused, as in one piece.
        let twice = t.replacen("\"lineage\"", "\"resour\\u0063es\": {}, \"lineage\"", 1);
        assert!(serde_json::from_str::<StateFile>(&twice).is_err());
        assert!(parse(&twice, 2).is_none());
        // Not an object, or no `resources`.
        assert!(parse("[]", 2).is_none());
        assert!(parse("{\"version\": 1, \"x\": \"resources\"}", 2).is_none());
        // Cuts that land in `shared` (the same indentation) fail their run: never a
        // different state.
        let mut few = state(3);
        for i in 0..3 {
            few.shared.insert(format!("shared.c{i}.ssh_key"), record(i));
        }
        let few = text(&few);
        let shared = few.find("\n  \"shared\"").unwrap();
        let at = cuts(&few, resources_open(&few).unwrap(), 64);
        assert!(at.iter().any(|&c| c > shared), "{at:?}");
        assert!(parse(&few, 64).is_none());
    }

    /// A record nested as deep as serde_json allows in one piece is refused or read
    /// alike when cut.
    #[test]
    fn the_nesting_limit_is_the_same_in_runs() {
        // Once in the first run, once in the last.
        for address in ["vm.m0001", "vm.m0039"] {
            let mut s = state(40);
            let r = s.resources.get_mut(address).unwrap();
            r.extra.insert("deep".into(), "DEEP".into());
            let t = text(&s);
            let (mut read, mut refused) = (0, 0);
            for depth in [100, 123, 124, 125, 126, 127, 130] {
                let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
                let nested = t.replacen("\"DEEP\"", &deep, 1);
                let one = serde_json::from_str::<StateFile>(&nested).ok();
                match &one {
                    Some(_) => read += 1,
                    None => refused += 1,
                }
                assert_eq!(parse(&nested, 2), one, "{address} at depth {depth}");
            }
            assert!(
                read > 0 && refused > 0,
                "the limit falls within the depths tried"
            );
        }
    }

    /// Through the state reader: a file large enough to be cut reads as in one piece, and
    /// a syntax error in its middle is named at the same line and column.
    #[test]
    fn the_state_reader_cuts_a_large_file_and_names_an_error_where_one_piece_does() {
        let t = text(&state(600));
        assert!(t.len() >= SPLIT_FROM, "{} bytes", t.len());
        let path = std::path::Path::new("gpuprov.state.json");
        let one: StateFile = serde_json::from_str(&t).unwrap();
        assert_eq!(super::super::file::parse(path, t.as_bytes()).unwrap(), one);
        for address in ["vm.m0150", "vm.m0450"] {
            let at = t.find(&format!("\"{address}\": {{")).unwrap();
            let at = at + t[at..].find("\"label\": \"ready\"").unwrap();
            let bad = format!("{}\"label\": ready{}", &t[..at], &t[at + 16..]);
            let want = serde_json::from_str::<StateFile>(&bad).unwrap_err();
            match super::super::file::parse(path, bad.as_bytes()) {
                Err(crate::state::StateError::Corrupt(c)) => {
                    assert_eq!(
                        (c.line, c.column),
                        (want.line(), want.column()),
                        "{address}"
                    );
                    assert!(c.reason.starts_with("expected value"), "{}", c.reason);
                }
                other => panic!("{address}: {other:?}"),
            }
        }
    }

    /// Hand-written files (line endings, indentation, key order and spelling, repeated
    /// keys, records that do not read, nesting at the limit, bytes around the object)
    /// read as in one piece, or not at all, for any number of parts.
    #[test]
    fn hand_written_files_read_as_in_one_piece_or_not_at_all() {
        const REC: &str = r#"{"machine": {"kind": "launch", "state": {}, "label": "l", "updated_at": "2026-12-01T10:00:00Z"}}"#;
        type Recs = Vec<(String, String)>;
        // `head` goes before `resources` (ending in a comma), `tail` after it.
        fn doc(head: &str, recs: &Recs, tail: &str, nl: &str, ind: &str) -> String {
            let mut t = format!("{{{nl}{ind}\"version\": 1,{nl}{ind}\"serial\": 1,{nl}{ind}\"lineage\": \"l\",{nl}{ind}\"gpuprov_version\": \"0\",{head}{nl}{ind}\"resources\": {{");
            for (i, (a, r)) in recs.iter().enumerate() {
                t.push_str(if i > 0 { "," } else { "" });
                t.push_str(&format!("{nl}{ind}{ind}\"{a}\": {r}"));
            }
            t + &format!("{nl}{ind}}}{tail}{nl}}}{nl}")
        }
        let r: Recs = (0..8)
            .map(|i| (format!("vm.{i}"), REC.to_string()))
            .collect();
        let set = |i: usize, a: &str, rec: &str| {
            let mut r = r.clone();
            r[i] = (a.to_string(), rec.to_string());
            r
        };
        let plain = |r: &Recs| doc("", r, "", "\n", "  ");
        let p = plain(&r);
        // A count of parts far above the records' never reserves memory for it.
        for parts in [usize::MAX, 1 << 40] {
            assert_eq!(parse(&p, parts), serde_json::from_str(&p).ok());
        }
        let shared = r#"{"machine": {"kind": "k", "state": 1, "label": "l", "updated_at": "2026-12-01T10:00:00Z"}}"#;
        let numbers = r#"{"machine": {"kind": "launch", "state": {"n": 1e400}, "label": "l", "updated_at": "2026-12-01T10:00:00Z"}, "x": [1.7976931348623157e308, -0, 0.1, 18446744073709551616, 1E-400, 123456789012345678901234567890]}"#;
        let in_string = r#"{"machine": {"kind": "launch", "state": ",\n    \"x\": 1", "label": "l", "updated_at": "2026-12-01T10:00:00Z"}}"#;
        let inner_indent = "{\"machine\": {\"kind\": \"launch\", \"state\": {\n    \"a\": 1,\n    \"b\": 2}, \"label\": \"l\",\n    \"updated_at\": \"2026-12-01T10:00:00Z\"}}";
        let first_key = {
            let s = p.find("\n  \"resources\"").unwrap();
            let e = p.rfind("\n  }").unwrap() + 4;
            format!("{{{},{}\n}}\n", &p[s..e], &p[1..s - 1])
        };
        // (what, text, whether some count of parts cuts it)
        let mut cases: Vec<(&str, String, bool)> = vec![
            ("CRLF", doc("", &r, "", "\r\n", "  "), true),
            ("tabs", doc("", &r, "", "\n", "\t"), true),
            ("CRLF and tabs", doc("", &r, "", "\r\n", "\t"), true),
            ("no indentation", doc("", &r, "", "\n", ""), true),
            ("CR only", doc("", &r, "", "\r", " "), false),
            ("no final newline", p.trim_end().to_string(), true),
            ("leading whitespace", format!(" \r\n\t{p}"), true),
            ("BOM", format!("\u{feff}{p}"), false),
            ("trailing garbage", format!("{p}x"), false),
            ("a second object", format!("{p}{{}}"), false),
            ("one record", plain(&r[..1].to_vec()), false),
            ("two records", plain(&r[..2].to_vec()), true),
            ("no records", plain(&Vec::new()), false),
            ("resources first", first_key, true),
            (
                "space before the colon",
                p.replacen("\"resources\": {", "\"resources\" \r\n:\t{", 1),
                true,
            ),
            (
                "escaped resources",
                p.replacen("\"resources\"", "\"\\u0072esources\"", 1),
                false,
            ),
            (
                "shared after",
                doc(
                    "",
                    &r,
                    &format!(",\n  \"shared\": {{\n    \"s.a\": {shared}\n  }}"),
                    "\n",
                    "  ",
                ),
                true,
            ),
            (
                "shared before",
                doc(
                    &format!("\n  \"shared\": {{\n    \"s.a\": {shared}\n  }},"),
                    &r,
                    "",
                    "\n",
                    "  ",
                ),
                true,
            ),
            (
                "resources nested after",
                doc(
                    "",
                    &r,
                    ",\n  \"z\": {\n    \"resources\": {\n    \"a\": 1,\n    \"b\": 2}}",
                    "\n",
                    "  ",
                ),
                true,
            ),
            (
                "resources nested before",
                doc(
                    "\n  \"z\": [\"resources\", {\"resources\": {\n    \"a\": 1,\n    \"b\": 2}}],",
                    &r,
                    "",
                    "\n",
                    "  ",
                ),
                true,
            ),
            (
                "escaped quote before",
                doc("\n  \"z\\\"\": \"resources\\\\\",", &r, "", "\n", "  "),
                true,
            ),
            (
                "resources twice, escaped first",
                doc("\n  \"resour\\u0063es\": {},", &r, "", "\n", "  "),
                false,
            ),
            (
                "resources twice, escaped last",
                doc("", &r, ",\n  \"resour\\u0063es\": {}", "\n", "  "),
                false,
            ),
            (
                "resources twice, plain first",
                doc("\n  \"resources\": {},", &r, "", "\n", "  "),
                false,
            ),
            (
                "resources twice, plain last",
                doc("", &r, ",\n  \"resources\": {}", "\n", "  "),
                false,
            ),
            (
                "resources null first",
                doc("\n  \"resources\": null,", &r, "", "\n", "  "),
                false,
            ),
            (
                "version twice",
                doc("", &r, ",\n  \"version\": 1", "\n", "  "),
                false,
            ),
            (
                "null record, first run",
                plain(&set(1, "vm.1", "null")),
                false,
            ),
            (
                "null record, last run",
                plain(&set(7, "vm.7", "null")),
                false,
            ),
            ("repeated address", plain(&set(3, "vm.0", REC)), true),
            (
                "repeated address, escaped",
                plain(&set(3, "vm.\\u0030", REC)),
                true,
            ),
            (
                "lone surrogate address",
                plain(&set(5, "vm.\\ud800", REC)),
                false,
            ),
            ("multi-byte address", plain(&set(2, "é東😀", REC)), true),
            ("numbers", plain(&set(1, "vm.1", numbers)), true),
            (
                "1e400 in an unknown field",
                plain(&set(1, "vm.1", &numbers.replace("-0", "1e400"))),
                false,
            ),
            ("a cut in a string", plain(&set(2, "vm.2", in_string)), true),
            (
                "a raw line break in a string",
                plain(&set(2, "vm.2", &in_string.replace("\\n", "\n"))),
                false,
            ),
            (
                "records indented as their fields",
                plain(
                    &r.iter()
                        .map(|(a, _)| (a.clone(), inner_indent.to_string()))
                        .collect(),
                ),
                false,
            ),
            (
                "two commas",
                p.replacen("},\n    \"vm.4\"", "},,\n    \"vm.4\"", 1),
                false,
            ),
            ("trailing comma", p.replacen("}\n  }", "},\n  }", 1), false),
            (
                "missing comma",
                p.replacen("},\n    \"vm.4\"", "}\n    \"vm.4\"", 1),
                false,
            ),
            (
                "space after the comma",
                p.replacen("},\n    \"vm.4\"", "}, \n    \"vm.4\"", 1),
                true,
            ),
        ];
        // At serde_json's nesting limit, in the first run and the last, in an unknown
        // field (limited) and in `state` (kept as text: not limited).
        for at in [0, 7] {
            for depth in [124, 125] {
                for (o, c) in [("[", "]"), ("{\"k\":", "}")] {
                    let deep = |n: usize| format!("{}1{}", o.repeat(n), c.repeat(n));
                    let extra = REC.replacen("}}", &format!("}}, \"deep\": {}}}", deep(depth)), 1);
                    cases.push((
                        "deep unknown field",
                        plain(&set(at, &r[at].0, &extra)),
                        depth == 124,
                    ));
                    let state = REC.replacen("{}", &deep(depth * 4), 1);
                    cases.push(("deep state", plain(&set(at, &r[at].0, &state)), true));
                }
            }
        }
        for (what, t, cut) in &cases {
            let one = serde_json::from_str::<StateFile>(t).ok();
            let mut some = false;
            for parts in [0, 1, 2, 3, 4, 5, 8, 1000] {
                let got = parse(t, parts);
                some |= got.is_some();
                if got.is_some() {
                    assert_eq!(got, one, "{what}, {parts} parts: {t:?}");
                    assert_eq!(format!("{got:?}"), format!("{one:?}"), "{what}: {t:?}");
                }
            }
            assert_eq!(some, *cut, "{what}: {t:?}");
        }
    }

    /// The top-level `resources` is found by reading keys, not by searching text.
    #[test]
    fn resources_is_found_only_as_a_top_level_key() {
        let t = r#"{"a": "\"resources\": {", "b": {"resources": {}}, "resources" : {"vm.a": 1}}"#;
        assert_eq!(resources_open(t), t.rfind('{'));
        assert!(resources_open(r#"{"resources": []}"#).is_none());
        assert!(resources_open(r#"{"x": {"#).is_none());
    }
}

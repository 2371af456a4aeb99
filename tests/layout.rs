//! Keeps the "Life of a Start" in `src/lib.rs` honest: every hop names a
//! file and the items in it, and a rename or a move that leaves the text
//! behind fails here, naming the hop.

use std::path::Path;

/// The section's text: from its heading to the next one.
fn life_of_a_start(lib: &str) -> String {
    let doc: Vec<&str> = lib
        .lines()
        .filter_map(|line| line.strip_prefix("//!"))
        .map(str::trim)
        .collect();
    let start = doc
        .iter()
        .position(|line| *line == "# Life of a Start")
        .expect("src/lib.rs has a \"# Life of a Start\" section");
    doc[start + 1..]
        .iter()
        .take_while(|line| !line.starts_with("# "))
        .copied()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The code spans of `text`, in order.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// Whether `source` defines `name`: a function, type or trait of that name.
fn defines(source: &str, name: &str) -> bool {
    ["fn", "struct", "enum", "trait", "type"]
        .iter()
        .any(|kind| {
            source
                .match_indices(&format!("{kind} {name}"))
                .any(|(at, found)| {
                    let next = source[at + found.len()..].chars().next();
                    !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
        })
}

/// Each item span (`Type::method`, `function`, `Type`) paired with the file
/// span before it.
fn hops(section: &str) -> Vec<(String, String)> {
    let mut file: Option<&str> = None;
    let mut hops = Vec::new();
    for span in code_spans(section) {
        if span.ends_with(".rs") {
            file = Some(span);
        } else if let Some(file) = file {
            if span
                .chars()
                .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
            {
                hops.push((file.to_owned(), span.to_owned()));
            }
        }
    }
    hops
}

#[test]
fn every_item_the_life_of_a_start_names_is_defined_where_it_says() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let section = life_of_a_start(&lib);
    let hops = hops(&section);
    assert!(hops.len() >= 20, "too few hops found: {hops:?}");
    let mut missing = Vec::new();
    for (file, item) in &hops {
        let source = std::fs::read_to_string(src.join(file))
            .unwrap_or_else(|_| panic!("src/{file}, named by the Life of a Start, is missing"));
        // `Type::method`: the method is in this file, and so is the type or
        // an `impl` of it; a bare name is defined in this file.
        let mut parts = item.rsplit("::");
        let name = parts.next().unwrap_or(item);
        let owner_present = parts.next().is_none_or(|owner| {
            defines(&source, owner) || source.contains(&format!("impl {owner}"))
        });
        if !defines(&source, name) || !owner_present {
            missing.push(format!("{file}: {item}"));
        }
    }
    assert!(
        missing.is_empty(),
        "the Life of a Start in src/lib.rs names items that are not where it says: {missing:#?}"
    );
}

#[test]
fn the_check_itself_tells_a_defined_item_from_a_missing_one() {
    let source = "impl Registry {\n    pub fn start(&self) {}\n}\nstruct Feed;\nfn starts() {}";
    assert!(defines(source, "start"));
    assert!(defines(source, "Feed"));
    assert!(
        !defines(source, "star"),
        "a prefix of a name is not the name"
    );
    assert!(!defines(source, "Registry"), "an impl is not a definition");
    let section = "1. `a.rs` `Type::call`: text `b.rs` `free` and `not an item`";
    assert_eq!(
        hops(section),
        [
            ("a.rs".to_owned(), "Type::call".to_owned()),
            ("b.rs".to_owned(), "free".to_owned())
        ]
    );
}

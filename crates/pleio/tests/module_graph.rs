//! No import cycles between the top-level modules of the engine (and of the
//! lab): a module never imports, directly or through others, a module that
//! imports it. Read from the sources: every `crate::name` path (in `use`
//! lines or inline, `crate::{a, b}` groups included) and every `super::`
//! path that climbs to the crate root, outside comments and the `tests`
//! module at the end of a file. A name the crate root re-exports
//! (`crate::Table`) counts as its module. The error module is a leaf.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Module name -> the files of that module (its `name.rs`, everything
/// under `name/`), with each file's depth below the crate root.
fn modules(src: &Path) -> BTreeMap<String, Vec<(PathBuf, usize)>> {
    fn walk(dir: &Path, depth: usize, out: &mut Vec<(PathBuf, usize)>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, depth + 1, out);
            } else if p.extension().is_some_and(|e| e == "rs") {
                // `x/mod.rs` sits at the depth of `x.rs`.
                let d = if p.file_name().is_some_and(|n| n == "mod.rs") {
                    depth - 1
                } else {
                    depth
                };
                out.push((p, d));
            }
        }
    }
    let mut mods: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    for e in fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            let mut files = Vec::new();
            walk(&p, 2, &mut files);
            mods.entry(stem).or_default().extend(files);
        } else if p.extension().is_some_and(|e| e == "rs") && stem != "lib" && stem != "main" {
            mods.entry(stem).or_default().push((p, 1));
        }
    }
    mods
}

/// The code of a file without comments and without its trailing
/// `#[cfg(test)] mod tests`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let line = match line.find("//") {
            // `//` inside a string (a URL) is rare in these sources; a
            // path after it would only be missed, never invented.
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The first segments of the paths in a `{...}` group starting at `s` (just
/// after the `{`), at its top level.
fn group_heads(s: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut expect = true;
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect = true,
            c if expect && depth == 0 && (c.is_ascii_alphabetic() || c == '_') => {
                heads.push(ident_at(&s[i..]).to_string());
                expect = false;
            }
            _ => {}
        }
    }
    heads
}

/// Root-relative names a file refers to: `crate::x`, `crate::{x, y}`, and
/// `super::` paths that climb `depth` levels (to the root).
fn root_refs(code: &str, depth: usize) -> Vec<String> {
    let mut refs = Vec::new();
    let mut prefixes = vec!["crate::".to_string()];
    if depth >= 1 {
        prefixes.push("super::".repeat(depth));
    }
    for prefix in &prefixes {
        let mut at = 0;
        while let Some(i) = code[at..].find(prefix.as_str()) {
            let start = at + i;
            at = start + prefix.len();
            let before = code[..start].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') {
                continue; // `super::super::` seen from a deeper prefix, or `foo_crate::`
            }
            let rest = &code[at..];
            if let Some(group) = rest.strip_prefix('{') {
                refs.extend(group_heads(group));
            } else {
                let id = ident_at(rest);
                if !id.is_empty() && id != "super" {
                    refs.push(id.to_string());
                }
            }
        }
    }
    refs
}

/// Names re-exported by the crate root (`pub use m::...::Name;`,
/// `pub use m::{A, B};`) -> the module `m` they come from.
fn root_reexports(lib: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let lib = code(lib);
    let mut at = 0;
    while let Some(i) = lib[at..].find("pub use ") {
        let start = at + i + "pub use ".len();
        let end = start + lib[start..].find(';').unwrap();
        at = end;
        let stmt: String = lib[start..end].split_whitespace().collect();
        let Some((module, rest)) = stmt.split_once("::") else {
            continue;
        };
        let names: Vec<String> = match rest.rfind('{') {
            Some(b) => group_heads(&rest[b + 1..])
                .into_iter()
                .chain(rest[b + 1..].split(',').filter_map(|p| {
                    let last = p.trim_end_matches('}').rsplit("::").next()?;
                    let last = last.rsplit(" as ").next()?;
                    (!last.is_empty()).then(|| last.to_string())
                }))
                .collect(),
            None => vec![rest.rsplit("::").next().unwrap().to_string()],
        };
        for n in names {
            map.insert(n, module.to_string());
        }
    }
    map
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let lib = ["lib.rs", "main.rs"]
        .iter()
        .find_map(|f| fs::read_to_string(src.join(f)).ok())
        .unwrap_or_default();
    let reexports = root_reexports(&lib);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, files) in &mods {
        let deps = g.entry(m.clone()).or_default();
        for (f, depth) in files {
            let text = fs::read_to_string(f).unwrap();
            for r in root_refs(&code(&text), *depth) {
                let target = if mods.contains_key(&r) {
                    Some(&r)
                } else {
                    reexports.get(&r)
                };
                if let Some(t) = target {
                    if t != m && mods.contains_key(t) {
                        deps.insert(t.clone());
                    }
                }
            }
        }
    }
    g
}

/// A cycle of `g`, if any, as the modules along it (first repeated last).
fn find_cycle(g: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        g: &BTreeMap<String, BTreeSet<String>>,
        m: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(m.to_string(), Mark::Open);
        path.push(m.to_string());
        for d in g.get(m).into_iter().flatten() {
            match marks.get(d).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let i = path.iter().position(|p| p == d).unwrap();
                    let mut cycle = path[i..].to_vec();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(g, d, marks, path) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks.insert(m.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in g.keys() {
        if marks.get(m).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(g, m, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

fn show(g: &BTreeMap<String, BTreeSet<String>>) -> String {
    g.iter()
        .map(|(m, d)| {
            format!(
                "  {m} -> {}\n",
                d.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        })
        .collect()
}

#[test]
fn engine_modules_have_no_import_cycle() {
    let g = graph(&crate_src("pleio"));
    assert!(g.len() > 10, "found too few modules:\n{}", show(&g));
    // The graph is read, not assumed: known edges must be there.
    assert!(g["fetch"].contains("layout"), "{}", show(&g));
    assert!(g["checkpoint"].contains("layout"), "{}", show(&g));
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle: {}\n{}", c.join(" -> "), show(&g));
    }
    assert!(
        g["error"].is_empty(),
        "the error module must be a leaf, it imports {:?}",
        g["error"]
    );
    assert!(
        g["layout"].iter().all(|d| d == "quant" || d == "error"),
        "layout must know no file format, it imports {:?}",
        g["layout"]
    );
}

#[test]
fn lab_modules_have_no_import_cycle() {
    let g = graph(&crate_src("pleio-lab"));
    assert!(g.len() > 3, "found too few modules:\n{}", show(&g));
    if let Some(c) = find_cycle(&g) {
        panic!("import cycle: {}\n{}", c.join(" -> "), show(&g));
    }
}

/// The checker finds a cycle when there is one.
#[test]
fn a_cycle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\npub use c::Thing;\n",
    )
    .unwrap();
    fs::write(src.join("a.rs"), "use crate::b::X;\n").unwrap();
    fs::create_dir(src.join("b")).unwrap();
    fs::write(src.join("b").join("mod.rs"), "mod inner;\n").unwrap();
    fs::write(
        src.join("b").join("inner.rs"),
        "// use crate::a;\nfn f() -> super::super::Thing { todo!() }\n",
    )
    .unwrap();
    fs::write(
        src.join("c.rs"),
        "use crate::{\n    a::Y,\n};\npub struct Thing;\n#[cfg(test)]\nmod tests { use crate::b; }\n",
    )
    .unwrap();
    let g = graph(src);
    assert_eq!(g["a"], BTreeSet::from(["b".to_string()]));
    assert_eq!(g["b"], BTreeSet::from(["c".to_string()]));
    assert_eq!(g["c"], BTreeSet::from(["a".to_string()]));
    let c = find_cycle(&g).expect("a -> b -> c -> a");
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
}

//! The house rules of `src/` (docs/DESIGN.md, "Module map"), checked from the
//! source text: every file but a named few sits in a folder, and imports go one
//! way, between files and between folders. Test modules are left out: a test may
//! reach anywhere.
//!
//! The reading is lexical, not rustc's: comments and literals are blanked, then
//! every path through `crate::`, `super::` or a child module's name is expanded
//! (`use` groups included) and resolved to the longest module it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The files allowed at the top of `src/`, and why (DESIGN.md says the same).
const AT_THE_TOP: &[(&str, &str)] = &[
    ("lib.rs", "the crate's map"),
    ("main.rs", "the command line"),
    (
        "assemble.rs",
        "the one file that names the dataplanes, above them and the engine",
    ),
];

#[test]
fn every_file_of_src_sits_in_a_folder_but_the_few_at_the_top() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let loose: Vec<String> = std::fs::read_dir(&src)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !AT_THE_TOP.iter().any(|(top, _)| top == name))
        .collect();
    assert!(
        loose.is_empty(),
        "files loose at the top of src/: {loose:?}"
    );
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let modules = Modules::read();
    assert!(
        modules.files.len() > 50,
        "read only {} modules",
        modules.files.len()
    );
    let edges = modules.edges();
    // The reading must see the imports it is there to judge.
    assert!(
        edges["nft::slots"].contains("nft::pick"),
        "nft::slots → nft::pick not seen"
    );
    assert!(
        edges["engine"].contains("engine::dataplane"),
        "engine → its child not seen"
    );
    assert_eq!(
        circles(&edges),
        Vec::<Vec<String>>::new(),
        "import circles between files"
    );
}

#[test]
fn no_folder_imports_one_that_imports_it_back() {
    let edges = Modules::read().edges();
    let top = |m: &str| m.split("::").next().unwrap().to_string();
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in &edges {
        let entry = folders.entry(top(from)).or_default();
        entry.extend(tos.iter().map(|t| top(t)).filter(|t| *t != top(from)));
    }
    assert!(folders["nft"].contains("netlink"), "nft → netlink not seen");
    assert_eq!(
        circles(&folders),
        Vec::<Vec<String>>::new(),
        "import circles between folders"
    );
}

/// The crate's modules, by path (`nft::slots`), each with its code outside test
/// modules, comments and literals blanked.
struct Modules {
    files: BTreeMap<String, String>,
}

impl Modules {
    fn read() -> Modules {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut paths = Vec::new();
        walk(&src, &mut paths);
        let mut files = BTreeMap::new();
        let mut test_files = BTreeSet::new();
        for path in &paths {
            let name = module_name(&src, path);
            if name.is_empty() {
                continue; // lib.rs and main.rs: the roots
            }
            let (code, test_children) =
                outside_tests(&blank(&std::fs::read_to_string(path).unwrap()));
            for child in test_children {
                test_files.insert(format!("{name}::{child}"));
            }
            files.insert(name, code);
        }
        files.retain(|name, _| !test_files.contains(name));
        Modules { files }
    }

    /// Each module's imports: the modules its paths name, neither itself nor an
    /// ancestor (a child reading its parent's items is how Rust nests).
    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (name, code) in &self.files {
            let children: Vec<&str> = self
                .files
                .keys()
                .filter_map(|m| m.strip_prefix(&format!("{name}::")))
                .filter(|rest| !rest.contains("::"))
                .collect();
            let mut to = BTreeSet::new();
            for path in paths_in(code, name, &children) {
                if let Some(target) = self.resolve(&path) {
                    let ancestor = name == &target || name.starts_with(&format!("{target}::"));
                    if !ancestor {
                        to.insert(target);
                    }
                }
            }
            edges.insert(name.clone(), to);
        }
        edges
    }

    /// The longest module `path` starts with.
    fn resolve(&self, path: &[String]) -> Option<String> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].join("::"))
            .find(|m| self.files.contains_key(m))
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/nft/slots.rs` → `nft::slots`; `src/nft/mod.rs` → `nft`; the roots → "".
fn module_name(src: &Path, path: &Path) -> String {
    let rel = path.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        return String::new();
    }
    parts.join("::")
}

/// The source with comments, strings and char literals replaced by spaces,
/// so braces and paths inside them are not read as code.
fn blank(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let skip_to = if c == '/' && next == Some('/') {
            chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(chars.len(), |p| i + p)
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            let mut j = i;
            loop {
                if chars[j] == '/' && chars.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if chars[j] == '*' && chars.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break j;
                    }
                } else {
                    j += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"') | Some('#'))
            && raw_string_may_start(&chars, i)
        {
            let hashes = chars[i + 1..].iter().take_while(|&&c| c == '#').count();
            if chars.get(i + 1 + hashes) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body_start = i + 2 + hashes;
            let rest: String = chars[body_start..].iter().collect();
            body_start + rest[..rest.find(&close).unwrap()].chars().count() + close.len()
        } else if c == '"' {
            let mut j = i + 1;
            while chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            j + 1
        } else if c == '\'' && next == Some('\\') {
            let mut j = i + 2;
            while chars[j] != '\'' {
                j += 1;
            }
            j + 1
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            i + 3
        } else {
            out.push(c);
            i += 1;
            continue;
        };
        out.extend(
            chars[i..skip_to]
                .iter()
                .map(|&c| if c == '\n' { '\n' } else { ' ' }),
        );
        i = skip_to;
    }
    out
}

/// Whether the `r` at `i` opens a raw string (`r"`, `br"`), not ends a name.
fn raw_string_may_start(chars: &[char], i: usize) -> bool {
    let before = |k: usize| if i >= k { chars[i - k] } else { ' ' };
    !ident_char(before(1)) || (before(1) == 'b' && !ident_char(before(2)))
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The code outside `#[cfg(test)]` items, and the names of child modules that
/// are test modules of their own (`#[cfg(test)] mod tests;`).
fn outside_tests(code: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut test_children = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let item = &rest[at + MARK.len()..];
        let end_of_item = item.find([';', '{']).expect("an item after #[cfg(test)]");
        let head = item[..end_of_item].trim();
        let skip = if item.as_bytes()[end_of_item] == b';' {
            if let Some(name) = head.strip_prefix("mod ") {
                test_children.push(name.trim().to_string());
            }
            end_of_item + 1
        } else {
            let mut depth = 0;
            let mut end = end_of_item;
            for (k, c) in item[end_of_item..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    end = end_of_item + k + 1;
                    break;
                }
            }
            end
        };
        rest = &item[skip..];
    }
    out.push_str(rest);
    (out, test_children)
}

/// Every path in `code` that leaves the module, as absolute segments: those
/// through `crate::`, `super::` (from `module`) and its `children`, with `use`
/// groups expanded.
fn paths_in(code: &str, module: &str, children: &[&str]) -> Vec<Vec<String>> {
    let here: Vec<String> = module.split("::").map(String::from).collect();
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut i = 0;
    while i < code.len() {
        let starts_word = i == 0 || !(ident_char(bytes[i - 1] as char) || bytes[i - 1] == b':');
        if !starts_word || !(bytes[i] as char).is_ascii_alphabetic() {
            i += 1;
            continue;
        }
        let word_end = i + code[i..]
            .find(|c: char| !ident_char(c))
            .unwrap_or(code.len() - i);
        let word = &code[i..word_end];
        let followed = code[word_end..].trim_start().starts_with("::");
        let base: Option<Vec<String>> = match word {
            _ if !followed => None,
            "crate" => Some(Vec::new()),
            "super" => Some(here[..here.len() - 1].to_vec()),
            _ if children.contains(&word) => Some([here.clone(), vec![word.to_string()]].concat()),
            _ => None,
        };
        match base {
            Some(base) => {
                let after = &code[word_end..];
                let after = after.trim_start().strip_prefix("::").unwrap();
                let used = expand(after, base, &mut out);
                i = word_end + (code[word_end..].len() - after.len()) + used;
            }
            None => i = word_end,
        }
    }
    out
}

/// Reads one path tree (`a::b`, `a::{b, c::d}`) from the start of `text` under
/// `base`, pushing each full path to `out`; returns the bytes it read.
fn expand(text: &str, base: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut path = base;
    let mut i = 0;
    loop {
        let rest = &text[i..];
        let lead = rest.len() - rest.trim_start().len();
        i += lead;
        let rest = &text[i..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut inner = group;
            loop {
                inner = inner.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
                if inner.starts_with('}') {
                    return text.len() - inner.len() + 1;
                }
                let used = expand(inner, path.clone(), out);
                // Past an `as name`, to the next `,` or `}`.
                let after = &inner[used..];
                inner = &after[after.find([',', '}']).unwrap_or(after.len())..];
            }
        }
        let seg_len = rest.find(|c: char| !ident_char(c)).unwrap_or(rest.len());
        if seg_len == 0 {
            out.push(path);
            return i;
        }
        let segment = &rest[..seg_len];
        if segment != "self" {
            path.push(segment.to_string());
        }
        i += seg_len;
        match text[i..].strip_prefix("::") {
            Some(_) => i += 2,
            None => {
                out.push(path);
                return i;
            }
        }
    }
}

/// The graph's circles (strongly connected parts of more than one node).
fn circles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    fn finish(
        n: &str,
        e: &BTreeMap<String, BTreeSet<String>>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(n.to_string()) {
            return;
        }
        for m in e.get(n).into_iter().flatten() {
            finish(m, e, seen, order);
        }
        order.push(n.to_string());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in edges.keys() {
        finish(n, edges, &mut seen, &mut order);
    }
    let mut reverse: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, tos) in edges {
        for to in tos {
            reverse.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut found = Vec::new();
    for n in order.iter().rev() {
        let mut part = Vec::new();
        finish(n, &reverse, &mut assigned, &mut part);
        if part.len() > 1 {
            part.sort();
            found.push(part);
        }
    }
    found
}

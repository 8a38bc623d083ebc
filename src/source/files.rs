//! Kubernetes objects from YAML or JSON manifests: files, multi-document files and
//! directories, with `kind: List` unwrapped. Other kinds (Deployments, Pods…) are
//! ignored, so a whole application's manifests can be pointed at.
//!
//! Two levels of failure, kept apart on purpose:
//! - A **file** that cannot be read, or is not YAML from start to end, is an error
//!   for the whole file (`ManifestError`, with its line). A file caught half-written
//!   must never read as a file with fewer Services: `ManifestStore` keeps such a
//!   file's last good objects, and the one-shot `load` refuses to go on.
//! - A **document** that is YAML but not a valid object (a Service whose ports are
//!   a number, say) is `Rejected` on its own; the rest of the file still loads.

use super::store::{service_update, slice_update};
use super::{list_updates, Update};
use crate::core::convert::Objects;
use crate::core::model::Rejected;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// Objects read from manifests, and the documents that could not be read.
#[derive(Debug, Clone, Default)]
pub struct Loaded {
    pub objects: Objects,
    pub rejected: Vec<Rejected>,
}

impl Loaded {
    fn extend(&mut self, other: &Loaded) {
        let o = &other.objects;
        self.objects.services.extend(o.services.iter().cloned());
        self.objects.slices.extend(o.slices.iter().cloned());
        self.objects.nodes.extend(o.nodes.iter().cloned());
        self.rejected.extend(other.rejected.iter().cloned());
    }
}

/// A manifest file (or a path named on the command line) that could not be used
/// at all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    pub file: PathBuf,
    /// 1-based, when the parser knows where it stopped.
    pub line: Option<usize>,
    pub reason: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file.display(), self.reason),
            None => write!(f, "{}: {}", self.file.display(), self.reason),
        }
    }
}

impl std::error::Error for ManifestError {}

/// Reads every manifest under `paths`, for the one-shot commands. Any file that
/// cannot be read or parsed is an error: acting on the others would treat that
/// file's Services as deleted.
pub fn load(paths: &[PathBuf]) -> Result<Loaded, ManifestError> {
    let mut loaded = Loaded::default();
    for file in manifest_files(paths)? {
        loaded.extend(&read_file(&file)?);
    }
    Ok(loaded)
}

fn read_file(file: &Path) -> Result<Loaded, ManifestError> {
    let text = std::fs::read_to_string(file).map_err(|e| ManifestError {
        file: file.to_path_buf(),
        line: None,
        reason: format!("cannot be read: {e}"),
    })?;
    parse(&text, &file.display().to_string()).map_err(|(line, reason)| ManifestError {
        file: file.to_path_buf(),
        line,
        reason,
    })
}

/// Files named by `paths`, with directories expanded (sorted, recursively) to their
/// `.yaml`, `.yml` and `.json` files.
pub fn manifest_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, ManifestError> {
    let mut out = Vec::new();
    for p in paths {
        collect(p, &mut out)?;
    }
    Ok(out)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> Result<(), ManifestError> {
    let unreadable = |e: std::io::Error| ManifestError {
        file: path.to_path_buf(),
        line: None,
        reason: format!("cannot be read: {e}"),
    };
    let meta = std::fs::metadata(path).map_err(unreadable)?;
    if !meta.is_dir() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(unreadable)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for e in entries {
        let is_manifest = e
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| matches!(x, "yaml" | "yml" | "json"));
        if e.is_dir() || is_manifest {
            collect(&e, out)?;
        }
    }
    Ok(())
}

/// Objects read from files as the updates an API source would send: a complete
/// list of each kind (files hold no ServiceCIDRs, so that list is empty), so
/// that files and the API server reach the model the same way.
pub fn updates(objects: Objects) -> impl Iterator<Item = Update> {
    list_updates(objects.services, service_update)
        .chain(list_updates(objects.slices, slice_update))
        .chain(list_updates(objects.nodes, Update::Node))
        .chain(list_updates(Vec::new(), Update::ServiceCidr))
}

/// What one `ManifestStore::reload` found.
#[derive(Debug, Default)]
pub struct Reloaded {
    /// Every file's objects: the current ones, or the last good ones of a file
    /// that now fails.
    pub loaded: Loaded,
    /// Files failing now whose error is new (first seen, or different from the
    /// last one), each with whether its last good objects were kept (false: it
    /// never read well): log and count these once.
    pub new_errors: Vec<(ManifestError, bool)>,
    /// Files that failed before and read well again.
    pub recovered: Vec<PathBuf>,
}

/// The manifests under some paths, re-read on demand by `run --manifests`. Each
/// file's objects are kept per file, so that a file which fails to read or parse
/// keeps the objects it last had, while the others follow their files.
pub struct ManifestStore {
    paths: Vec<PathBuf>,
    good: BTreeMap<PathBuf, Loaded>,
    /// The current error of each failing file (or path).
    failing: BTreeMap<PathBuf, ManifestError>,
    ready: bool,
}

impl ManifestStore {
    pub fn new(paths: &[PathBuf]) -> ManifestStore {
        ManifestStore {
            paths: paths.to_vec(),
            good: BTreeMap::new(),
            failing: BTreeMap::new(),
            ready: false,
        }
    }

    /// Every file has read well together once: the objects are a whole picture,
    /// as a first list is for the API source. Before that, programming would
    /// delete the Services of a file that has never been read (a restart over a
    /// broken file keeps the rules the kernel has). A file that appears later and
    /// never reads well is skipped; it never had rules.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Files failing now.
    pub fn errors(&self) -> impl Iterator<Item = &ManifestError> {
        self.failing.values()
    }

    pub fn reload(&mut self) -> Reloaded {
        let mut failing = BTreeMap::new();
        let mut good = BTreeMap::new();
        for path in &self.paths {
            match manifest_files(std::slice::from_ref(path)) {
                Ok(files) => {
                    for file in files {
                        match read_file(&file) {
                            Ok(loaded) => {
                                good.insert(file, loaded);
                            }
                            Err(e) => {
                                if let Some(last) = self.good.remove(&file) {
                                    good.insert(file.clone(), last);
                                }
                                failing.insert(file, e);
                            }
                        }
                    }
                }
                // A path that cannot be listed keeps every file it held.
                Err(e) => {
                    let kept: Vec<PathBuf> = self
                        .good
                        .keys()
                        .filter(|f| f.starts_with(path))
                        .cloned()
                        .collect();
                    for f in kept {
                        let last = self.good.remove(&f).expect("listed just now");
                        good.insert(f, last);
                    }
                    failing.insert(path.clone(), e);
                }
            }
        }
        let new_errors = failing
            .values()
            .filter(|e| self.failing.get(&e.file) != Some(*e))
            .map(|e| (e.clone(), good.keys().any(|f| f.starts_with(&e.file))))
            .collect();
        let recovered = self
            .failing
            .keys()
            .filter(|f| !failing.contains_key(*f))
            .cloned()
            .collect();
        self.good = good;
        self.failing = failing;
        self.ready |= self.failing.is_empty();
        let mut loaded = Loaded::default();
        for l in self.good.values() {
            loaded.extend(l);
        }
        Reloaded {
            loaded,
            new_errors,
            recovered,
        }
    }
}

/// Parses one manifest text (several `---`-separated documents). A syntax error
/// anywhere fails the whole text, with its line when known; a document of the
/// wrong shape is only rejected. An empty text fails too: `cmd > file` leaves the
/// file empty until `cmd` writes, and that must not read as "no Services" (a file
/// is emptied of its Services by deleting it, or by writing `---`).
pub fn parse(text: &str, origin: &str) -> Result<Loaded, (Option<usize>, String)> {
    if text.trim().is_empty() {
        return Err((None, "is empty".into()));
    }
    // Each document as JSON's data model: what the API types deserialize from.
    // The parser's default budget guards against hostile input and stops at 1,024
    // documents and 250k nodes: about 5k objects. A manifest is the operator's
    // own file, and 10k Services are 20k documents; the anchor and alias limits
    // (which guard against expansion bombs) stay as they are.
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_documents: 1_000_000,
            max_nodes: 100_000_000,
            max_events: 400_000_000,
            max_total_scalar_bytes: 1 << 30,
        },
    };
    let docs: Vec<Value> =
        serde_saphyr::from_multiple_with_options(text, options).map_err(|e| {
            let line = e.location().map(|l| l.line() as usize);
            (line, format!("not valid YAML: {}", yaml_error(&e)))
        })?;
    let mut loaded = Loaded::default();
    for (i, doc) in docs.into_iter().enumerate() {
        let position = format!("{origin}: document {}", i + 1);
        if !doc.is_null() {
            add_value(doc, &position, &mut loaded);
        }
    }
    Ok(loaded)
}

/// A YAML error in one line: the parser's first line, without the source
/// snippet it draws under it.
pub fn yaml_error(e: &serde_saphyr::Error) -> String {
    let text = e.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

fn str_field<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn add_value(value: Value, position: &str, loaded: &mut Loaded) {
    let api_version = str_field(&value, "apiVersion").to_string();
    let kind = str_field(&value, "kind").to_string();
    let name = value
        .get("metadata")
        .map(|m| str_field(m, "name").to_string())
        .unwrap_or_default();
    let object = format!("{kind} {name} ({position})");
    let bad = |e: serde_json::Error| Rejected {
        object: object.clone(),
        field: String::new(),
        reason: e.to_string(),
    };
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => match serde_json::from_value(value) {
            Ok(s) => loaded.objects.services.push(s),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => match serde_json::from_value(value) {
            Ok(s) => loaded.objects.slices.push(s),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        ("v1", "Node") => match serde_json::from_value(value) {
            Ok(n) => loaded.objects.nodes.push(n),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        (_, "List") | (_, "ServiceList") | (_, "EndpointSliceList") | (_, "NodeList") => {
            let items = match value.get("items") {
                Some(Value::Array(items)) => items.clone(),
                _ => Vec::new(),
            };
            // Items of a typed list may omit apiVersion/kind; fill them in from the list.
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for (i, mut item) in items.into_iter().enumerate() {
                if let (Some(k), Value::Object(m)) = (item_kind, &mut item) {
                    m.entry("kind").or_insert(k.into());
                    m.entry("apiVersion").or_insert(api_version.clone().into());
                }
                add_value(item, &format!("{position}, item {}", i + 1), loaded);
            }
        }
        _ => tracing::debug!("{object}: ignoring {api_version}/{kind}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_document_file_with_other_kinds_loads_services_and_slices() {
        let text = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
endpoints: []
"#;
        let loaded = parse(text, "app.yaml").unwrap();
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        assert_eq!(loaded.objects.services.len(), 1);
        assert_eq!(loaded.objects.slices.len(), 1);
    }

    #[test]
    fn recorded_api_server_lists_load() {
        // The repository's copy: a clone on its own has no ../shared.
        let dir = crate::bench::apiserver::fixtures();
        let mut loaded = Loaded::default();
        for f in [
            "list-services.json",
            "list-endpointslices.json",
            "node-node1.json",
        ] {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            loaded.extend(&parse(&text, f).unwrap());
        }
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        assert_eq!(loaded.objects.services.len(), 5);
        assert_eq!(loaded.objects.slices.len(), 1);
        assert_eq!(loaded.objects.nodes.len(), 1);
    }

    #[test]
    fn a_document_of_the_wrong_shape_is_rejected_with_its_position() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: 7}\n";
        let loaded = parse(text, "bad.yaml").unwrap();
        assert_eq!(loaded.rejected.len(), 1);
        assert!(loaded.rejected[0].object.contains("bad.yaml: document 1"));
    }

    const WEB: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec: {clusterIP: 10.0.0.1, ports: [{port: 80}]}\n";
    const DB: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: db, namespace: default}\nspec: {clusterIP: 10.0.0.2, ports: [{port: 5432}]}\n";

    fn names(loaded: &Loaded) -> Vec<String> {
        let mut v: Vec<String> = loaded
            .objects
            .services
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        v.sort();
        v
    }

    /// A directory of its own under the system's temporary directory.
    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kube-nft-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_syntax_error_fails_the_whole_text_with_its_line() {
        let text = format!("{WEB}---\nkind: [unclosed\n");
        let (line, reason) = parse(&text, "t.yaml").unwrap_err();
        assert_eq!(line, Some(6), "{reason}");
        assert!(reason.contains("not valid YAML"), "{reason}");
        assert!(parse("\u{0}\u{1}garbage: : :\n", "t.yaml").is_err());
    }

    #[test]
    fn a_file_that_stops_parsing_keeps_its_last_good_objects() {
        let dir = scratch("store-keep");
        let (web, db) = (dir.join("web.yaml"), dir.join("db.yaml"));
        std::fs::write(&web, WEB).unwrap();
        std::fs::write(&db, DB).unwrap();
        let mut store = ManifestStore::new(std::slice::from_ref(&dir));
        let first = store.reload();
        assert!(store.ready() && first.new_errors.is_empty());
        assert_eq!(names(&first.loaded), ["db", "web"]);

        // Garbage, then a file cut in the middle of a flow mapping.
        for broken in ["}}} not yaml {{{\n\t:", &WEB[..WEB.len() - 20]] {
            std::fs::write(&web, broken).unwrap();
            let r = store.reload();
            assert_eq!(names(&r.loaded), ["db", "web"], "{broken:?}");
            assert_eq!(r.new_errors.len(), 1, "{broken:?}");
            let (e, kept) = &r.new_errors[0];
            assert_eq!((&e.file, kept), (&web, &true));
            assert!(e.line.is_some(), "{e:?}");
            // The same error again is not new.
            assert!(store.reload().new_errors.is_empty());
            assert_eq!(store.errors().count(), 1);
        }
        // Emptied (as `cmd > file` does before cmd writes), or bytes that are not UTF-8.
        std::fs::write(&web, "").unwrap();
        assert_eq!(names(&store.reload().loaded), ["db", "web"]);
        std::fs::write(&web, [0xff, 0xfe, 0x00]).unwrap();
        assert_eq!(names(&store.reload().loaded), ["db", "web"]);

        // Fixed: the new objects apply, the recovery is reported.
        std::fs::write(&web, WEB.replace("name: web", "name: web2")).unwrap();
        let r = store.reload();
        assert_eq!(names(&r.loaded), ["db", "web2"]);
        assert_eq!(r.recovered, std::slice::from_ref(&web));
        assert_eq!(store.errors().count(), 0);

        // A file removed from the directory takes its objects with it.
        std::fs::remove_file(&web).unwrap();
        assert_eq!(names(&store.reload().loaded), ["db"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_named_file_that_disappears_keeps_its_objects_and_a_broken_start_is_not_ready() {
        let dir = scratch("store-missing");
        let web = dir.join("web.yaml");
        std::fs::write(&web, "{{{").unwrap();
        let mut store = ManifestStore::new(std::slice::from_ref(&web));
        let r = store.reload();
        assert!(!r.new_errors[0].1, "nothing was kept: it never read well");
        assert!(
            !store.ready(),
            "a file never read well leaves the store not ready"
        );
        assert!(r.loaded.objects.services.is_empty());
        std::fs::write(&web, WEB).unwrap();
        store.reload();
        assert!(store.ready());
        std::fs::remove_file(&web).unwrap();
        let r = store.reload();
        assert_eq!(names(&r.loaded), ["web"]);
        assert!(
            r.new_errors[0].0.reason.contains("cannot be read"),
            "{:?}",
            r.new_errors
        );
        assert!(store.ready(), "ready stays once reached");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_one_shot_load_refuses_a_file_that_does_not_parse() {
        let dir = scratch("load-strict");
        std::fs::write(dir.join("web.yaml"), WEB).unwrap();
        std::fs::write(dir.join("broken.yaml"), "a: [\n").unwrap();
        let e = load(std::slice::from_ref(&dir)).unwrap_err();
        assert_eq!(e.file, dir.join("broken.yaml"));
        assert!(e.to_string().contains("broken.yaml:"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

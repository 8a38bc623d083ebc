//! Kubernetes objects from YAML or JSON manifests: files, multi-document files and
//! directories, with `kind: List` unwrapped. Other kinds (Deployments, Pods…) are
//! ignored, so a whole application's manifests can be pointed at.
//!
//! A document that does not parse is reported as rejected, with its file and
//! position; the rest of the file still loads.

use crate::model::{Objects, Rejected};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Objects read from manifests, and the documents that could not be read.
#[derive(Debug, Default)]
pub struct Loaded {
    pub objects: Objects,
    pub rejected: Vec<Rejected>,
}

/// Reads every manifest under `paths`. Errors only when a path cannot be read at all.
pub fn load(paths: &[PathBuf]) -> std::io::Result<Loaded> {
    let mut loaded = Loaded::default();
    for file in manifest_files(paths)? {
        let text = std::fs::read_to_string(&file)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", file.display())))?;
        load_str(&text, &file.display().to_string(), &mut loaded);
    }
    Ok(loaded)
}

/// Files named by `paths`, with directories expanded (sorted, recursively) to their
/// `.yaml`, `.yml` and `.json` files.
pub fn manifest_files(paths: &[PathBuf]) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        collect(p, &mut out)?;
    }
    Ok(out)
}

fn collect(path: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let meta = std::fs::metadata(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if !meta.is_dir() {
        out.push(path.to_path_buf());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)?
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

/// Parses one manifest text (several `---`-separated documents) into `loaded`.
pub fn load_str(text: &str, origin: &str, loaded: &mut Loaded) {
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let position = format!("{origin}: document {}", i + 1);
        match serde_yaml::Value::deserialize(doc) {
            Ok(serde_yaml::Value::Null) => {}
            Ok(value) => add_value(value, &position, loaded),
            Err(e) => {
                loaded.rejected.push(Rejected {
                    object: position,
                    field: String::new(),
                    reason: format!("not valid YAML: {e}"),
                });
                // The YAML stream cannot be resynchronised after a syntax error.
                break;
            }
        }
    }
}

fn str_field<'a>(v: &'a serde_yaml::Value, key: &str) -> &'a str {
    v.get(key).and_then(|x| x.as_str()).unwrap_or("")
}

fn add_value(value: serde_yaml::Value, position: &str, loaded: &mut Loaded) {
    let api_version = str_field(&value, "apiVersion").to_string();
    let kind = str_field(&value, "kind").to_string();
    let name = value
        .get("metadata")
        .map(|m| str_field(m, "name").to_string())
        .unwrap_or_default();
    let object = format!("{kind} {name} ({position})");
    let bad = |e: serde_yaml::Error| Rejected {
        object: object.clone(),
        field: String::new(),
        reason: e.to_string(),
    };
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Service") => match serde_yaml::from_value(value) {
            Ok(s) => loaded.objects.services.push(s),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        ("discovery.k8s.io/v1", "EndpointSlice") => match serde_yaml::from_value(value) {
            Ok(s) => loaded.objects.slices.push(s),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        ("v1", "Node") => match serde_yaml::from_value(value) {
            Ok(n) => loaded.objects.nodes.push(n),
            Err(e) => loaded.rejected.push(bad(e)),
        },
        (_, "List") | (_, "ServiceList") | (_, "EndpointSliceList") | (_, "NodeList") => {
            let items = match value.get("items") {
                Some(serde_yaml::Value::Sequence(items)) => items.clone(),
                _ => Vec::new(),
            };
            // Items of a typed list may omit apiVersion/kind; fill them in from the list.
            let item_kind = kind.strip_suffix("List").filter(|k| !k.is_empty());
            for (i, mut item) in items.into_iter().enumerate() {
                if let (Some(k), serde_yaml::Value::Mapping(m)) = (item_kind, &mut item) {
                    m.entry("kind".into()).or_insert(k.into());
                    m.entry("apiVersion".into())
                        .or_insert(api_version.clone().into());
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
        let mut loaded = Loaded::default();
        load_str(text, "app.yaml", &mut loaded);
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        assert_eq!(loaded.objects.services.len(), 1);
        assert_eq!(loaded.objects.slices.len(), 1);
    }

    #[test]
    fn recorded_api_server_lists_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/k8s-fixtures");
        assert!(
            dir.exists(),
            "{} is missing: the recorded fixtures live beside the repository",
            dir.display()
        );
        let mut loaded = Loaded::default();
        for f in [
            "list-services.json",
            "list-endpointslices.json",
            "node-node1.json",
        ] {
            let text = std::fs::read_to_string(dir.join(f)).unwrap();
            load_str(&text, f, &mut loaded);
        }
        assert!(loaded.rejected.is_empty(), "{:?}", loaded.rejected);
        assert_eq!(loaded.objects.services.len(), 5);
        assert_eq!(loaded.objects.slices.len(), 1);
        assert_eq!(loaded.objects.nodes.len(), 1);
    }

    #[test]
    fn a_document_of_the_wrong_shape_is_rejected_with_its_position() {
        let text = "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {ports: 7}\n";
        let mut loaded = Loaded::default();
        load_str(text, "bad.yaml", &mut loaded);
        assert_eq!(loaded.rejected.len(), 1);
        assert!(loaded.rejected[0].object.contains("bad.yaml: document 1"));
    }
}

//! Loading Kubernetes manifests from files and directories.
//!
//! `route explain` and the standalone-mode file provider read the same
//! manifests a user would `kubectl apply`: YAML (several documents per file)
//! or JSON, one object per document, `kind: List` expanded. Every problem is
//! reported with its file and document index and never stops the other
//! files or documents: callers decide whether any error is fatal.
//!
//! Rules:
//! - A directory is walked recursively, in name order; only `.yaml`, `.yml`
//!   and `.json` files are read, and entries whose name starts with `.` are
//!   skipped (this also skips the `..data` folders of mounted ConfigMaps,
//!   whose files would otherwise be read twice). A file named explicitly is
//!   read whatever its extension.
//! - YAML documents are separated by `---` lines; empty documents are
//!   ignored. Each document becomes a `serde_json::Value`.
//! - Each object needs `apiVersion`, `kind` and `metadata.name`; a missing
//!   `metadata.namespace` is set to `default` (also for cluster-scoped
//!   kinds, where it is meaningless and harmless).

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Where an object or an error came from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source {
    /// The file.
    pub file: PathBuf,
    /// Index of the YAML document in the file (0 for JSON); `None` when the
    /// whole file is concerned (unreadable).
    pub doc_index: Option<usize>,
    /// Index in `items` when the object came from a `kind: List`.
    pub item: Option<usize>,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(doc) = self.doc_index {
            write!(f, " (document {doc}")?;
            if let Some(item) = self.item {
                write!(f, ", item {item}")?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

/// One Kubernetes object read from a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedObject {
    /// Where it came from.
    pub source: Source,
    /// `apiVersion`, e.g. `networking.k8s.io/v1`.
    pub api_version: String,
    /// `kind`, e.g. `Ingress`.
    pub kind: String,
    /// `metadata.namespace`, `default` when missing.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// The whole object, with `metadata.namespace` filled in.
    pub value: Value,
}

impl LoadedObject {
    /// Deserialises the object into a typed Kubernetes object.
    ///
    /// ```
    /// use k8s_openapi::api::networking::v1::Ingress;
    /// use tuna_operator::manifest::load_str;
    ///
    /// let loaded = load_str("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web}\n", "x.yaml".as_ref());
    /// let ingress: Ingress = loaded.objects[0].parse().unwrap();
    /// assert_eq!(ingress.metadata.namespace.as_deref(), Some("default"));
    /// ```
    pub fn parse<K: DeserializeOwned>(&self) -> Result<K, ManifestError> {
        serde_json::from_value(self.value.clone()).map_err(|e| ManifestError {
            source: self.source.clone(),
            message: format!("{} {}/{}: {e}", self.kind, self.namespace, self.name),
        })
    }

    /// True when the object is of this API group (empty for core) and kind.
    pub fn is(&self, group: &str, kind: &str) -> bool {
        let object_group = self.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        object_group == group && self.kind == kind
    }
}

/// A problem with one file or document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// Where.
    pub source: Source,
    /// What, for a human.
    pub message: String,
}

// Written by hand: thiserror would take the `source` field for the error's
// cause, and a `Source` is a location, not an error.
impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.source, self.message)
    }
}

impl std::error::Error for ManifestError {}

/// Everything read from a set of paths.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// Objects in file order, then document order.
    pub objects: Vec<LoadedObject>,
    /// Problems, in the same order.
    pub errors: Vec<ManifestError>,
}

impl Loaded {
    fn extend(&mut self, other: Loaded) {
        self.objects.extend(other.objects);
        self.errors.extend(other.errors);
    }
}

/// Loads files and directories (see the module docs).
///
/// ```
/// let loaded = tuna_operator::manifest::load_paths(&["/does/not/exist".into()]);
/// assert!(loaded.objects.is_empty());
/// assert_eq!(loaded.errors.len(), 1);
/// ```
pub fn load_paths(paths: &[PathBuf]) -> Loaded {
    let mut loaded = Loaded::default();
    for path in paths {
        load_path(path, true, &mut loaded);
    }
    loaded
}

fn load_path(path: &Path, explicit: bool, loaded: &mut Loaded) {
    let whole = |message: String| ManifestError {
        source: Source {
            file: path.to_owned(),
            doc_index: None,
            item: None,
        },
        message,
    };
    let metadata = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) => {
            loaded.errors.push(whole(format!("cannot read: {e}")));
            return;
        }
    };
    if metadata.is_dir() {
        let mut entries: Vec<PathBuf> = match std::fs::read_dir(path) {
            Ok(dir) => dir.filter_map(|e| e.ok().map(|e| e.path())).collect(),
            Err(e) => {
                loaded
                    .errors
                    .push(whole(format!("cannot list directory: {e}")));
                return;
            }
        };
        entries.sort();
        for entry in entries {
            let hidden = entry
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if !hidden {
                load_path(&entry, false, loaded);
            }
        }
        return;
    }
    let extension = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    if !explicit && !matches!(extension, "yaml" | "yml" | "json") {
        return;
    }
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) if extension == "json" => loaded.extend(load_json(&text, path)),
            Ok(text) => loaded.extend(load_str(&text, path)),
            Err(_) => loaded.errors.push(whole("not UTF-8 text".into())),
        },
        Err(e) => loaded.errors.push(whole(format!("cannot read: {e}"))),
    }
}

/// Loads one JSON document (an object or a `List`).
pub fn load_json(text: &str, file: &Path) -> Loaded {
    let mut loaded = Loaded::default();
    let source = Source {
        file: file.to_owned(),
        doc_index: Some(0),
        item: None,
    };
    match serde_json::from_str::<Value>(text) {
        Ok(value) => add_document(value, source, &mut loaded),
        Err(e) => loaded.errors.push(ManifestError {
            source,
            message: format!("invalid JSON: {e}"),
        }),
    }
    loaded
}

/// Loads YAML text with any number of documents; `file` only labels sources.
///
/// ```
/// use tuna_operator::manifest::load_str;
///
/// let text = "apiVersion: v1\nkind: Service\nmetadata: {name: a}\n---\nnot: [valid\n---\napiVersion: v1\nkind: Service\nmetadata: {name: b, namespace: x}\n";
/// let loaded = load_str(text, "m.yaml".as_ref());
/// assert_eq!(loaded.objects.len(), 2);
/// assert_eq!(loaded.objects[1].namespace, "x");
/// assert_eq!(loaded.errors[0].source.doc_index, Some(1));
/// ```
pub fn load_str(text: &str, file: &Path) -> Loaded {
    let mut loaded = Loaded::default();
    for (doc_index, doc) in split_documents(text).into_iter().enumerate() {
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
        {
            continue;
        }
        let source = Source {
            file: file.to_owned(),
            doc_index: Some(doc_index),
            item: None,
        };
        match serde_saphyr::from_str::<Value>(&doc) {
            Ok(Value::Null) => {}
            Ok(value) => add_document(value, source, &mut loaded),
            Err(e) => loaded.errors.push(ManifestError {
                source,
                message: format!("invalid YAML: {e}"),
            }),
        }
    }
    loaded
}

/// Splits at `---` document markers (a line that is `---`, optionally
/// followed by a space and more). Splitting before parsing gives each
/// document its own errors, so one broken document spares the others.
fn split_documents(text: &str) -> Vec<String> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        let is_marker = line == "---" || line.starts_with("--- ") || line.starts_with("---\t");
        if is_marker {
            docs.push(String::new());
            let rest = line[3..].trim();
            // Content after the marker (`--- {a: 1}`) belongs to the new document.
            if !rest.is_empty() && !rest.starts_with('#') {
                docs.last_mut().expect("just pushed").push_str(rest);
                docs.last_mut().expect("just pushed").push('\n');
            }
        } else if line == "..." {
            // Document end marker: what follows starts a new document.
            docs.push(String::new());
        } else {
            let doc = docs.last_mut().expect("never empty");
            doc.push_str(line);
            doc.push('\n');
        }
    }
    // A leading `---` yields an empty first document: drop it so document
    // indexes count real documents only when the file starts with a marker.
    if text.starts_with("---") && docs.first().is_some_and(|d| d.is_empty()) {
        docs.remove(0);
    }
    docs
}

fn add_document(value: Value, source: Source, loaded: &mut Loaded) {
    let is_list = value
        .get("kind")
        .and_then(Value::as_str)
        .is_some_and(|k| k == "List" || k.ends_with("List"))
        && value.get("items").is_some();
    if is_list {
        match value.get("items").and_then(Value::as_array) {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    let source = Source {
                        item: Some(i),
                        ..source.clone()
                    };
                    add_object(item.clone(), source, loaded);
                }
            }
            None => loaded.errors.push(ManifestError {
                source,
                message: "List items must be a sequence".into(),
            }),
        }
        return;
    }
    add_object(value, source, loaded);
}

fn add_object(mut value: Value, source: Source, loaded: &mut Loaded) {
    let error = |message: String| ManifestError {
        source: source.clone(),
        message,
    };
    if !value.is_object() {
        loaded.errors.push(error(
            "a document must be a mapping (a Kubernetes object)".into(),
        ));
        return;
    }
    let text = |v: &Value, key: &str| v.get(key).and_then(Value::as_str).map(str::to_owned);
    let (Some(api_version), Some(kind)) = (text(&value, "apiVersion"), text(&value, "kind")) else {
        loaded
            .errors
            .push(error("missing apiVersion or kind".into()));
        return;
    };
    let Some(name) = value
        .get("metadata")
        .and_then(|m| text(m, "name"))
        .filter(|n| !n.is_empty())
    else {
        loaded
            .errors
            .push(error(format!("{kind} without metadata.name")));
        return;
    };
    let namespace = value
        .get("metadata")
        .and_then(|m| text(m, "namespace"))
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    if let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("namespace".into(), Value::String(namespace.clone()));
    }
    loaded.objects.push(LoadedObject {
        source,
        api_version,
        kind,
        namespace,
        name,
        value,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_expanded_and_errors_keep_their_place() {
        let text = "\
# leading comment
---
apiVersion: v1
kind: List
items:
  - {apiVersion: v1, kind: Service, metadata: {name: a}}
  - {apiVersion: v1, kind: Service}
---
---
- just a sequence
--- {apiVersion: v1, kind: ConfigMap, metadata: {name: inline, namespace: x}}
";
        let loaded = load_str(text, Path::new("f.yaml"));
        let names: Vec<(&str, Option<usize>, Option<usize>)> = loaded
            .objects
            .iter()
            .map(|o| (o.name.as_str(), o.source.doc_index, o.source.item))
            .collect();
        assert_eq!(names, [("a", Some(1), Some(0)), ("inline", Some(4), None)]);
        let errors: Vec<(Option<usize>, Option<usize>)> = loaded
            .errors
            .iter()
            .map(|e| (e.source.doc_index, e.source.item))
            .collect();
        assert_eq!(errors, [(Some(1), Some(1)), (Some(3), None)]);
        assert_eq!(loaded.objects[1].namespace, "x");
    }

    #[test]
    fn directories_are_walked_recursively_skipping_hidden_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let obj =
            |name: &str| format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n");
        std::fs::create_dir_all(dir.path().join("sub/deeper")).unwrap();
        std::fs::create_dir_all(dir.path().join("..data")).unwrap();
        std::fs::write(dir.path().join("a.yaml"), obj("a")).unwrap();
        std::fs::write(dir.path().join("sub/b.yml"), obj("b")).unwrap();
        std::fs::write(
            dir.path().join("sub/deeper/c.json"),
            r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"c"}}"#,
        )
        .unwrap();
        std::fs::write(dir.path().join("sub/notes.txt"), "not a manifest").unwrap();
        std::fs::write(dir.path().join("..data/a.yaml"), obj("hidden")).unwrap();
        std::fs::write(dir.path().join("broken.yaml"), "apiVersion: [").unwrap();
        let loaded = load_paths(&[dir.path().to_owned()]);
        let names: Vec<&str> = loaded.objects.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(loaded.errors.len(), 1);
        assert!(loaded.errors[0].source.file.ends_with("broken.yaml"));
    }

    #[test]
    fn objects_need_kind_and_name() {
        let loaded = load_str(
            "apiVersion: v1\nkind: Service\n---\nkind: Service\nmetadata: {name: x}\n",
            Path::new("f"),
        );
        assert!(loaded.objects.is_empty());
        assert_eq!(loaded.errors.len(), 2);
        assert!(
            loaded.errors[0]
                .to_string()
                .contains("without metadata.name"),
            "{}",
            loaded.errors[0]
        );
    }
}

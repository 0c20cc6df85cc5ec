//! `src/protobuf_schema.txt` — the field numbers, types and JSON names of every
//! built-in Kubernetes protobuf message — is generated from the sources of two
//! crates in Cargo.lock: `k8s-pb` (the kube-rs project's prost types of the
//! upstream `generated.proto` files: field numbers and wire types, and which
//! message is which apiVersion/kind) and `k8s-openapi` (the JSON names, which
//! prost's snake_case loses: `podIP`, `$ref`, and the Go structs' inlined
//! members such as `Volume.volumeSource`). This test regenerates it and fails
//! on drift; `UPDATE_GOLDEN=1 cargo test -p kube-emulator --test protobuf_schema`
//! rewrites it after a version bump of either crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// The k8s-openapi version folder whose JSON names are used: the Kubernetes
/// release of k8s-pb's protos (k8s-pb 0.9 carries 1.35's).
const OPENAPI_VERSION_DIR: &str = "v1_35";

fn package_dir(name: &str) -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let manifest = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not in Cargo.lock"))["manifest_path"]
        .as_str()
        .unwrap()
        .to_owned();
    Path::new(&manifest).parent().unwrap().to_owned()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `module path` (`api.core.v1`) of a file under `src/`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = rel
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    if last != "mod.rs" && last != "lib.rs" {
        parts.push(last.trim_end_matches(".rs").to_owned());
    }
    parts
}

/// Field names compared without underscores and case: prost and k8s-openapi
/// snake-case acronyms differently (`non_resource_ur_ls` / `non_resource_urls`).
fn norm_field(name: &str) -> String {
    name.trim_start_matches("r#")
        .replace('_', "")
        .to_lowercase()
}

/// k8s-openapi: lowercased "module.Struct" → (rust field → JSON name).
fn openapi_names(root: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let src = root.join("src").join(OPENAPI_VERSION_DIR);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let strukt = Regex::new(r"(?m)^pub struct (\w+)").unwrap();
    let key = Regex::new(r#""([^"]+)" => Field::Key_(\w+),"#).unwrap();
    let mut out = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let Some(name) = strukt.captures(&text).map(|c| c[1].to_owned()) else {
            continue;
        };
        let mut module = module_of(&src, &f);
        module.pop(); // the file is the struct
        let fields: BTreeMap<String, String> = key
            .captures_iter(&text)
            .map(|c| (norm_field(&c[2]), c[1].to_owned()))
            .collect();
        out.insert(
            format!("{}.{}", module.join("."), name).to_lowercase(),
            fields,
        );
    }
    out
}

#[derive(Debug, Clone)]
struct Field {
    tag: u32,
    /// Normalised (see norm_field) for matching.
    rust: String,
    /// prost's name, for the lowerCamel fallback.
    snake: String,
    card: &'static str,
    ty: String,
}

/// k8s-pb: full message name → fields; (apiVersion, kind) → message.
#[allow(clippy::type_complexity)]
fn pb_messages(
    root: &Path,
) -> (
    BTreeMap<String, Vec<Field>>,
    BTreeMap<(String, String), String>,
) {
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let strukt = Regex::new(r"^pub struct (\w+) \{").unwrap(); // `{}` when empty
    let attr = Regex::new(r"^\s*#\[prost\((.*)\)\]").unwrap();
    let field = Regex::new(r"^\s*pub ((?:r#)?\w+):\s*(.+),$").unwrap();
    let tag = Regex::new(r#"tag = "(\d+)""#).unwrap();
    let path = Regex::new(r"(?:super::|[a-z_][a-z0-9_]*::)*[A-Z][A-Za-z0-9]*").unwrap();
    let resource = Regex::new(r"^impl crate::Resource for (\w+) \{").unwrap();
    let api_version = Regex::new(r#"const API_VERSION: &'static str = "([^"]+)";"#).unwrap();
    let kind = Regex::new(r#"const KIND: &'static str = "([^"]+)";"#).unwrap();
    let mut messages = BTreeMap::new();
    let mut kinds = BTreeMap::new();
    for f in files {
        let module = module_of(&src, &f);
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut i = 0;
        while i < lines.len() {
            if let Some(c) = strukt.captures(lines[i]) {
                let name = format!("{}.{}", module.join("."), &c[1]);
                let mut fields = Vec::new();
                let mut pending: Option<String> = None;
                let empty = lines[i].trim_end().ends_with("{}");
                i += 1;
                while !empty && i < lines.len() && lines[i] != "}" {
                    // rustfmt wraps long fields: `pub labels:` then the type.
                    let mut line = lines[i].to_owned();
                    while line.trim_end().ends_with(':') && i + 1 < lines.len() {
                        i += 1;
                        line = format!("{line} {}", lines[i].trim());
                    }
                    while line.trim_start().starts_with("pub ")
                        && (!line.trim_end().ends_with(',')
                            || line.matches('<').count() > line.matches('>').count())
                        && i + 1 < lines.len()
                    {
                        i += 1;
                        line = format!("{line}{}", lines[i].trim());
                    }
                    if let Some(a) = attr.captures(&line) {
                        pending = Some(a[1].to_owned());
                    } else if let (Some(a), Some(fc)) = (&pending, field.captures(&line)) {
                        let tag_no: u32 = tag.captures(a).expect("tag")[1].parse().unwrap();
                        let kind_of = a.split(',').next().unwrap().trim();
                        let (card, ty) = if let Some(m) = a.strip_prefix("btree_map = \"string, ") {
                            let value = m.split('"').next().unwrap();
                            ("map", value.to_owned())
                        } else if kind_of.starts_with("bytes") {
                            ("one", "bytes".to_owned())
                        } else if a.contains("repeated") {
                            ("many", kind_of.to_owned())
                        } else {
                            ("one", kind_of.to_owned())
                        };
                        let ty = if ty == "message" {
                            let target = path
                                .find_iter(&fc[2])
                                .map(|m| m.as_str())
                                .filter(|p| {
                                    let last = p.rsplit("::").next().unwrap();
                                    !matches!(
                                        last,
                                        "Option" | "Vec" | "String" | "BTreeMap" | "Box"
                                    )
                                })
                                .last()
                                .unwrap_or_else(|| panic!("no message type in {}", &fc[2]));
                            let mut m = module.clone();
                            let mut rest = target;
                            while let Some(r) = rest.strip_prefix("super::") {
                                m.pop();
                                rest = r;
                            }
                            format!(
                                "msg:{}",
                                m.into_iter()
                                    .chain(rest.split("::").map(str::to_owned))
                                    .collect::<Vec<_>>()
                                    .join(".")
                            )
                        } else {
                            ty
                        };
                        fields.push(Field {
                            tag: tag_no,
                            rust: norm_field(&fc[1]),
                            snake: fc[1]
                                .trim_start_matches("r#")
                                .trim_end_matches('_')
                                .to_owned(),
                            card,
                            ty,
                        });
                        pending = None;
                    }
                    i += 1;
                }
                messages.insert(name, fields);
            } else if let Some(c) = resource.captures(lines[i]) {
                let block = lines[i..(i + 8).min(lines.len())].join("\n");
                if let (Some(v), Some(k)) = (api_version.captures(&block), kind.captures(&block)) {
                    kinds.insert(
                        (v[1].to_owned(), k[1].to_owned()),
                        format!("{}.{}", module.join("."), &c[1]),
                    );
                }
            }
            i += 1;
        }
    }
    (messages, kinds)
}

fn lower_camel(snake: &str) -> String {
    let mut out = String::new();
    let mut up = false;
    for ch in snake.chars() {
        if ch == '_' {
            up = true;
        } else if up {
            out.extend(ch.to_uppercase());
            up = false;
        } else {
            out.push(ch);
        }
    }
    out
}

fn generate() -> String {
    let pb = package_dir("k8s-pb");
    let openapi = package_dir("k8s-openapi");
    let names = openapi_names(&openapi);
    let (messages, kinds) = pb_messages(&pb);
    let mut out = String::from(
        "# Generated by conformance/kube-emulator/tests/protobuf_schema.rs from the sources of\n\
         # k8s-pb (field numbers, types, kinds) and k8s-openapi (JSON names). Do not edit.\n\
         # kind <apiVersion> <Kind> <message> | message <name> | <tag> <json> <one|many|map|inline> <type>\n",
    );
    // Every message with ObjectMeta `metadata` in a module of a known
    // apiVersion is a kind (k8s-pb implements `Resource` only for some).
    let mut all_kinds = kinds.clone();
    let versions: BTreeMap<String, String> = kinds
        .iter()
        .map(|((v, _), m)| (m.rsplit_once('.').unwrap().0.to_owned(), v.clone()))
        .collect();
    for (name, fields) in &messages {
        let (module, kind) = name.rsplit_once('.').unwrap();
        if let Some(v) = versions.get(module)
            && fields.iter().any(|f| {
                f.rust == "metadata" && f.ty == "msg:apimachinery.pkg.apis.meta.v1.ObjectMeta"
            })
        {
            all_kinds
                .entry((v.clone(), kind.to_owned()))
                .or_insert_with(|| name.clone());
        }
    }
    for ((v, k), m) in &all_kinds {
        out.push_str(&format!("kind {v} {k} {m}\n"));
    }
    let mut guessed = BTreeSet::new();
    for (name, fields) in &messages {
        out.push_str(&format!("message {name}\n"));
        let json = names.get(&name.to_lowercase());
        for f in fields {
            let (json_name, card) = match json.and_then(|j| j.get(&f.rust)) {
                Some(j) => (j.clone(), f.card),
                None => {
                    // A Go struct member inlined into its parent's JSON
                    // (`Volume.volumeSource`): the parent has the member's keys.
                    let inlined = json.is_some()
                        && f.card == "one"
                        && f.ty.strip_prefix("msg:").is_some_and(|t| {
                            let parent = json.unwrap();
                            messages.get(t).is_some_and(|member| {
                                !member.is_empty()
                                    && member.iter().all(|m| parent.contains_key(&m.rust))
                            })
                        });
                    if inlined {
                        (lower_camel(&f.snake), "inline")
                    } else {
                        let special = match (name.rsplit('.').next().unwrap(), f.rust.as_str()) {
                            ("JsonSchemaProps", "ref") => Some("$ref"),
                            ("JsonSchemaProps", "schema") => Some("$schema"),
                            _ => None,
                        };
                        if special.is_none() && json.is_some() {
                            guessed.insert(format!("{name}.{}", f.snake));
                        }
                        (
                            special.map_or_else(|| lower_camel(&f.snake), str::to_owned),
                            f.card,
                        )
                    }
                }
            };
            out.push_str(&format!("{} {json_name} {card} {}\n", f.tag, f.ty));
        }
    }
    out.push_str(&format!(
        "# {} messages, {} kinds. JSON names guessed as lowerCamel (no k8s-openapi field): {}\n",
        messages.len(),
        all_kinds.len(),
        guessed.into_iter().collect::<Vec<_>>().join(" ")
    ));
    out
}

#[test]
fn the_protobuf_schema_is_generated_from_k8s_pb_and_k8s_openapi() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/protobuf_schema.txt");
    let now = generate();
    let update = std::env::var_os("UPDATE_GOLDEN").is_some_and(|v| v != "0");
    if update {
        std::fs::write(&path, &now).unwrap();
    }
    // Spot checks of what the generator must get right.
    for line in [
        "kind rbac.authorization.k8s.io/v1 Role api.rbac.v1.Role\n",
        "kind apps/v1 Deployment api.apps.v1.Deployment\n",
        "message api.core.v1.PodStatus\n",
        "2 volumeSource inline msg:api.core.v1.VolumeSource\n",
        "3 $ref one string\n",
        "1 metadata one msg:apimachinery.pkg.apis.meta.v1.ObjectMeta\n",
        "11 labels map string\n",
    ] {
        assert!(
            now.contains(line),
            "{line:?} missing from the generated schema"
        );
    }
    assert!(now.contains(" podIP one string\n"));
    if update {
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == now,
        "{} is stale: UPDATE_GOLDEN=1 cargo test -p kube-emulator --test protobuf_schema",
        path.display()
    );
}

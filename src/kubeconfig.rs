//! The cluster's configuration, found the way kube's `Config::infer` finds it: the files
//! `KUBECONFIG` lists (merged: the first file to set a value wins), else `~/.kube/config`, else
//! the pod's service account.
//!
//! Only the reading of a file differs from kube. kube deserializes the YAML straight into its
//! kubeconfig types, which compiles serde_saphyr's deserializer once for each of them: about
//! 300 KB of machine code. The kernel maps a binary's code around every page a process touches,
//! so each replica would keep that code in memory at rest, though a pod reads no kubeconfig.
//! Here the YAML becomes a `serde_json::Value` (one deserializer for every type), and the Value
//! becomes kube's types. The rest is what kube does: the documents of one file merge as files
//! do, a relative file path in a file is taken from that file's directory, and a byte-order
//! mark says the encoding. One difference remains: a scalar that YAML reads as a number or a
//! boolean where a string belongs (`name: 2024`) is refused with its field path, as a JSON
//! kubeconfig with `"name": 2024` would be; kube would take it as the string.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use kube::config::{Config, InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why a kubeconfig could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// `KUBECONFIG` names no file and there is no home directory for `~/.kube/config`.
    #[error("KUBECONFIG names no file and there is no home directory to find ~/.kube/config in")]
    NoHome,
    /// The file could not be read, or its bytes are not text.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML.
    #[error("{} is not YAML: {source}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A document of the file is YAML but not a kubeconfig.
    #[error("{} is not a kubeconfig: {source}", path.display())]
    Fields {
        path: PathBuf,
        #[source]
        source: serde_path_to_error::Error<serde_json::Error>,
    },
    /// The file's `kind` or `apiVersion` differs from those read before it.
    #[error("{} cannot be merged with what was read before it: {source}", path.display())]
    Merge {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
}

/// Why no configuration was made from a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// No kubeconfig could be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The kubeconfig was read but its context cannot be used (none named, a cluster missing,
    /// a certificate that does not load, ...).
    #[error(transparent)]
    Use(#[from] KubeconfigError),
}

/// Why [`infer`] found no configuration: the kubeconfig's reason and the service account's.
#[derive(Debug, thiserror::Error)]
#[error("kubeconfig: {kubeconfig}; in-cluster: {in_cluster}")]
pub struct InferError {
    /// Why no kubeconfig could be used.
    pub kubeconfig: LoadError,
    /// Why the pod's service account could not be used.
    pub in_cluster: InClusterError,
}

/// The configuration of the current context of the kubeconfig found, else the pod's service
/// account; kube's debugging overrides (`KUBE_RS_DEBUG_*`) applied, as `Config::infer` does.
pub async fn infer() -> Result<Config, InferError> {
    let mut config = match from_found(&KubeConfigOptions::default()).await {
        Ok(config) => config,
        Err(kubeconfig) => Config::incluster().map_err(|in_cluster| InferError {
            kubeconfig,
            in_cluster,
        })?,
    };
    config.apply_debug_overrides();
    Ok(config)
}

/// The configuration of `options`' context in the kubeconfig `KUBECONFIG` lists, else in
/// `~/.kube/config`.
pub async fn from_found(options: &KubeConfigOptions) -> Result<Config, LoadError> {
    let kubeconfig = found(std::env::var_os("KUBECONFIG"), std::env::home_dir())?;
    Ok(Config::from_custom_kubeconfig(kubeconfig, options).await?)
}

/// The configuration of `options`' context in the kubeconfig file `path`.
pub async fn from_file(path: &Path, options: &KubeConfigOptions) -> Result<Config, LoadError> {
    Ok(Config::from_custom_kubeconfig(read(path)?, options).await?)
}

/// The files `listed` names (a `KUBECONFIG` value; empty entries are skipped), merged in their
/// order; without any, `home`'s `.kube/config`.
fn found(listed: Option<OsString>, home: Option<PathBuf>) -> Result<Kubeconfig, ReadError> {
    let files: Vec<PathBuf> = listed
        .map(|value| {
            let files = std::env::split_paths(&value);
            files.filter(|p| !p.as_os_str().is_empty()).collect()
        })
        .unwrap_or_default();
    if files.is_empty() {
        let home = home.ok_or(ReadError::NoHome)?;
        return read(&home.join(".kube").join("config"));
    }
    files
        .into_iter()
        .try_fold(Kubeconfig::default(), |merged, path| {
            merge(merged, read(&path)?, &path)
        })
}

/// The kubeconfig file `path`: its documents merged, its relative file paths made absolute.
fn read(path: &Path) -> Result<Kubeconfig, ReadError> {
    let text = std::fs::read(path)
        .and_then(decode)
        .map_err(|source| ReadError::Read {
            path: path.to_owned(),
            source,
        })?;
    let documents: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).map_err(|source| ReadError::Yaml {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
    documents
        .into_iter()
        .try_fold(Kubeconfig::default(), |merged, document| {
            let mut next: Kubeconfig =
                serde_path_to_error::deserialize(document).map_err(|source| ReadError::Fields {
                    path: path.to_owned(),
                    source,
                })?;
            if let Some(dir) = path.parent() {
                absolute_paths(&mut next, dir);
            }
            merge(merged, next, path)
        })
}

fn merge(merged: Kubeconfig, next: Kubeconfig, path: &Path) -> Result<Kubeconfig, ReadError> {
    merged.merge(next).map_err(|source| ReadError::Merge {
        path: path.to_owned(),
        source,
    })
}

/// The file's text: UTF-8, or UTF-16 when a byte-order mark says so (Windows tools write it).
fn decode(bytes: Vec<u8>) -> std::io::Result<String> {
    let invalid = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    // An odd length is not UTF-16: `chunks_exact` would drop the last byte.
    let utf16 = |body: &[u8], unit: fn([u8; 2]) -> u16| {
        if !body.len().is_multiple_of(2) {
            return None;
        }
        let units: Vec<u16> = body.chunks_exact(2).map(|p| unit([p[0], p[1]])).collect();
        String::from_utf16(&units).ok()
    };
    match bytes.as_slice() {
        [0xFF, 0xFE, body @ ..] => {
            utf16(body, u16::from_le_bytes).ok_or_else(|| invalid("invalid UTF-16 (LE)"))
        }
        [0xFE, 0xFF, body @ ..] => {
            utf16(body, u16::from_be_bytes).ok_or_else(|| invalid("invalid UTF-16 (BE)"))
        }
        [0xEF, 0xBB, 0xBF, body @ ..] => {
            String::from_utf8(body.to_vec()).map_err(|_| invalid("invalid UTF-8"))
        }
        _ => String::from_utf8(bytes).map_err(|_| invalid("invalid UTF-8")),
    }
}

/// The file paths a kubeconfig names, relative ones taken from `dir`: certificate authority,
/// client certificate and key, token file, and an exec plugin's command when it holds a path
/// separator (a bare name is looked up in `PATH`), as kubectl and kube do.
fn absolute_paths(kubeconfig: &mut Kubeconfig, dir: &Path) {
    let absolute = |file: &mut Option<String>| {
        if let Some(name) = file.as_deref().filter(|f| Path::new(f).is_relative())
            && let Some(joined) = dir.join(name).to_str()
        {
            *file = Some(joined.to_owned());
        }
    };
    for cluster in kubeconfig
        .clusters
        .iter_mut()
        .filter_map(|c| c.cluster.as_mut())
    {
        absolute(&mut cluster.certificate_authority);
    }
    for user in kubeconfig
        .auth_infos
        .iter_mut()
        .filter_map(|u| u.auth_info.as_mut())
    {
        absolute(&mut user.client_certificate);
        absolute(&mut user.client_key);
        absolute(&mut user.token_file);
        if let Some(exec) = user.exec.as_mut()
            && exec
                .command
                .as_deref()
                .is_some_and(|c| c.contains(std::path::MAIN_SEPARATOR))
        {
            absolute(&mut exec.command);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two documents; relative and absolute file paths; an exec plugin by path and one by
    /// name; fields kube does not model; a context named in both documents.
    const RICH: &str = r#"
apiVersion: v1
kind: Config
current-context: dev
preferences: {colors: true}
clusters:
- name: dev
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: certs/ca.crt
    tls-server-name: api.dev
    proxy-url: http://proxy:3128
- name: prod
  cluster:
    server: https://prod.example.com
    insecure-skip-tls-verify: true
users:
- name: alice
  user:
    client-certificate: alice.crt
    client-key: /etc/keys/alice.key
    token: "0123"
- name: bob
  user:
    tokenFile: tokens/bob
    exec:
      apiVersion: client.authentication.k8s.io/v1
      command: ./bin/helper
      args: [get-token, --cluster, dev]
      env: [{name: A, value: "1"}]
      interactiveMode: Never
      provideClusterInfo: true
- name: carol
  user:
    exec: {apiVersion: client.authentication.k8s.io/v1, command: aws}
contexts:
- name: dev
  context: {cluster: dev, user: alice, namespace: team-a}
extensions:
- name: tool
  extension: {anything: [1, 2]}
custom-field: {kept: true}
---
# The second document: adds a context, and its `dev` loses to the first's.
contexts:
- name: dev
  context: {cluster: prod, user: bob}
- name: prod
  context: {cluster: prod, user: carol}
current-context: prod
"#;

    fn write(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    fn json(kubeconfig: &Kubeconfig) -> serde_json::Value {
        serde_json::to_value(kubeconfig).unwrap()
    }

    #[test]
    fn a_file_reads_as_kube_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "config", RICH);
        let ours = read(&path).unwrap();
        assert_eq!(json(&ours), json(&Kubeconfig::read_from(&path).unwrap()));
        // What that means, spelled out.
        assert_eq!(ours.current_context.as_deref(), Some("dev"));
        assert_eq!(ours.contexts.len(), 2);
        let cluster = ours.clusters[0].cluster.as_ref().unwrap();
        let in_dir = |file: &str| dir.path().join(file).to_str().unwrap().to_owned();
        assert_eq!(cluster.certificate_authority, Some(in_dir("certs/ca.crt")));
        let alice = ours.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(alice.client_certificate, Some(in_dir("alice.crt")));
        assert_eq!(alice.client_key.as_deref(), Some("/etc/keys/alice.key"));
        let bob = ours.auth_infos[1].auth_info.as_ref().unwrap();
        assert_eq!(bob.token_file, Some(in_dir("tokens/bob")));
        let helper = bob.exec.as_ref().unwrap().command.as_deref().unwrap();
        assert_eq!(Path::new(helper), dir.path().join("./bin/helper"));
        let carol = ours.auth_infos[2].auth_info.as_ref().unwrap();
        assert_eq!(carol.exec.as_ref().unwrap().command.as_deref(), Some("aws"));
        assert_eq!(
            ours.other["custom-field"],
            serde_json::json!({"kept": true})
        );
    }

    #[test]
    fn the_files_kubeconfig_lists_merge_in_order_and_empty_entries_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let (first, second) = RICH.split_once("---").unwrap();
        let a = write(dir.path(), "a", first);
        let b = write(dir.path(), "b", second);
        let listed = std::env::join_paths([&a, Path::new(""), &b]).unwrap();
        let merged = found(Some(listed), None).unwrap();
        assert_eq!(
            json(&merged),
            json(&read(&write(dir.path(), "c", RICH)).unwrap())
        );

        let empty = found(Some(OsString::new()), Some(dir.path().into()));
        assert!(
            matches!(&empty, Err(ReadError::Read { path, .. }) if path.ends_with(".kube/config")),
            "an empty KUBECONFIG reads ~/.kube/config: {empty:?}"
        );
    }

    #[test]
    fn without_kubeconfig_the_home_directorys_is_read() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".kube")).unwrap();
        write(&home.path().join(".kube"), "config", RICH);
        let read = found(None, Some(home.path().into())).unwrap();
        assert_eq!(read.current_context.as_deref(), Some("dev"));
        let none = found(None, None).unwrap_err();
        assert!(matches!(none, ReadError::NoHome), "{none}");
    }

    #[test]
    fn a_byte_order_mark_says_the_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let plain = json(&read(&write(dir.path(), "plain", RICH)).unwrap());
        let utf16 = |unit: fn(u16) -> [u8; 2], mark: [u8; 2]| -> Vec<u8> {
            let units = RICH.encode_utf16().flat_map(unit);
            mark.into_iter().chain(units).collect()
        };
        let files = [
            ("utf8-bom", [&[0xEF, 0xBB, 0xBF], RICH.as_bytes()].concat()),
            ("utf16-le", utf16(u16::to_le_bytes, [0xFF, 0xFE])),
            ("utf16-be", utf16(u16::to_be_bytes, [0xFE, 0xFF])),
        ];
        for (name, bytes) in files {
            let path = write(dir.path(), name, bytes);
            assert_eq!(json(&read(&path).unwrap()), plain, "{name}");
        }
        let odd = write(dir.path(), "odd", [0xFF, 0xFE, b'a', 0, b'b']);
        let error = read(&odd).unwrap_err().to_string();
        assert!(error.contains("invalid UTF-16 (LE)"), "{error}");
    }

    #[test]
    fn what_is_not_a_kubeconfig_is_refused_with_the_file_and_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (
                "number",
                "clusters:\n- name: 2024\n  cluster: {server: https://a}\n",
                "clusters[0].name",
            ),
            ("list", "contexts: {dev: {}}\n", "contexts"),
            ("yaml", "clusters: [\n", "is not YAML"),
            (
                "kind",
                "kind: Config\n---\nkind: Other\n",
                "cannot be merged",
            ),
        ];
        for (name, text, said) in cases {
            let path = write(dir.path(), name, text);
            let error = read(&path).unwrap_err().to_string();
            assert!(error.contains(path.to_str().unwrap()), "{error}");
            assert!(
                error.contains(said),
                "{name}: {said:?} missing from: {error}"
            );
        }
        // kube's own reader takes that number as the name: the one difference (module docs).
        let number = Kubeconfig::read_from(dir.path().join("number")).unwrap();
        assert_eq!(number.clusters[0].name, "2024");
        let missing = dir.path().join("missing");
        let error = read(&missing).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("cannot read {}", missing.display())),
            "{error}"
        );
    }

    #[test]
    fn an_empty_file_or_document_is_an_empty_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in [
            ("empty", ""),
            ("comments", "# nothing\n"),
            ("bare", "---\n---\n"),
            ("null", "~\n"),
        ] {
            let path = write(dir.path(), name, text);
            let ours = read(&path).unwrap();
            assert_eq!(json(&ours), json(&Kubeconfig::default()), "{name}");
            assert_eq!(
                json(&ours),
                json(&Kubeconfig::read_from(&path).unwrap()),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn a_file_makes_the_config_of_its_context() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "config", RICH);
        let options = KubeConfigOptions {
            context: Some("prod".into()),
            ..KubeConfigOptions::default()
        };
        let config = from_file(&path, &options).await.unwrap();
        assert_eq!(config.cluster_url.to_string(), "https://prod.example.com/");
        let unknown = KubeConfigOptions {
            context: Some("nope".into()),
            ..KubeConfigOptions::default()
        };
        let error = from_file(&path, &unknown).await.unwrap_err();
        assert!(matches!(error, LoadError::Use(_)), "{error}");
    }
}

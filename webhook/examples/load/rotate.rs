//! The `pki` and `rotate` scenarios: certificate rotation the kubelet's way, under load.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::{CertificateDer, pem::PemObject as _};

use super::{Flags, Options, body_of, post};

const SERVICE: &str = "myapp-operator-webhook.myapp-system.svc";

/// The CA's parameters; the same every time, so `rotate` can sign with the key `pki` wrote.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, "load driver ca");
    params
}

fn key_path(ca: &Path) -> PathBuf {
    ca.with_extension("key")
}

/// A serving pair; `valid` is the (not before, not after) years, or the default (always).
fn pair(issuer: &Issuer<'_, KeyPair>, valid: Option<(i32, i32)>) -> (String, String) {
    let mut params = CertificateParams::new(vec![SERVICE.to_owned()]).unwrap();
    if let Some((from, to)) = valid {
        params.not_before = rcgen::date_time_ymd(from, 1, 1);
        params.not_after = rcgen::date_time_ymd(to, 1, 1);
    }
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Publishes a pair as the kubelet updates a mounted Secret: a new timestamped directory, a
/// new `..data` link renamed over the old one, the old directory removed.
fn publish(dir: &Path, cert: &str, key: &str) {
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir(&fresh).unwrap();
    std::fs::write(fresh.join("tls.crt"), cert).unwrap();
    std::fs::write(fresh.join("tls.key"), key).unwrap();
    let old = std::fs::read_link(dir.join("..data")).ok();
    std::os::unix::fs::symlink(&stamp, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if let Some(old) = old {
        std::fs::remove_dir_all(dir.join(old)).unwrap();
    }
}

/// `pki --cert-dir D --ca C [--valid expired]`.
pub fn pki(flags: &Flags) {
    let dir = PathBuf::from(flags.get("cert-dir").expect("--cert-dir"));
    let ca = PathBuf::from(flags.get("ca").expect("--ca"));
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let params = ca_params();
    std::fs::write(&ca, params.self_signed(&key).unwrap().pem()).unwrap();
    std::fs::write(key_path(&ca), key.serialize_pem()).unwrap();
    let issuer = Issuer::new(params, key);
    let valid = match flags.get("valid").map(String::as_str) {
        None => None,
        Some("expired") => Some((2020, 2021)),
        Some(other) => panic!("--valid {other}: only `expired`"),
    };
    let (cert, key) = pair(&issuer, valid);
    std::fs::create_dir_all(&dir).unwrap();
    publish(&dir, &cert, &key);
    for name in ["tls.crt", "tls.key"] {
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(format!("..data/{name}"), link).unwrap();
    }
    println!(
        "wrote {} and a serving pair in {}",
        ca.display(),
        dir.display()
    );
}

/// What the load saw: answers, failures, and every leaf certificate served.
#[derive(Default)]
struct Seen {
    answered: u64,
    failures: Vec<String>,
    leaves: Vec<CertificateDer<'static>>,
}

/// One review on a fresh connection; the leaf certificate the server presented.
async fn review_seeing_leaf(
    options: &Options,
    body: bytes::Bytes,
) -> Result<CertificateDer<'static>, String> {
    let stream = super::tls(options, options.addr)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .ok_or("no certificate")?[0]
        .clone();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    post(&mut sender, &options.path, body).await?;
    Ok(leaf)
}

/// `rotate`: `--rotations` publications, `--rate` reviews per second on fresh connections.
pub async fn rotate(options: &Arc<Options>) {
    let dir = PathBuf::from(options.flags.get("cert-dir").expect("--cert-dir"));
    let ca = PathBuf::from(options.flags.get("ca").expect("--ca"));
    let key = KeyPair::from_pem(&std::fs::read_to_string(key_path(&ca)).unwrap()).unwrap();
    let issuer = Issuer::new(ca_params(), key);
    let rotations: usize = options
        .flags
        .get("rotations")
        .map_or(20, |r| r.parse().expect("--rotations"));

    let current = review_seeing_leaf(options, body_of(&options.review))
        .await
        .expect("the server answers before the rotations");
    let mut valid: HashSet<CertificateDer<'static>> = HashSet::from([current.clone()]);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (options, seen, stop) = (options.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut interval = tokio::time::interval(Duration::from_secs(1) / options.rate as u32);
            let mut requests = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                interval.tick().await;
                let (options, seen) = (options.clone(), seen.clone());
                requests.push(tokio::spawn(async move {
                    let body = body_of(&options.review);
                    let result = tokio::time::timeout(
                        Duration::from_secs(10),
                        review_seeing_leaf(&options, body),
                    )
                    .await
                    .unwrap_or_else(|_| Err("no answer within 10 s".to_owned()));
                    let mut seen = seen.lock().unwrap();
                    match result {
                        Ok(leaf) => {
                            seen.answered += 1;
                            seen.leaves.push(leaf);
                        }
                        Err(error) => seen.failures.push(error),
                    }
                }));
            }
            for request in requests {
                let _ = request.await;
            }
        })
    };

    let kinds = [
        "valid",
        "expired",
        "valid",
        "not-yet-valid",
        "valid",
        "mismatched",
        "valid",
        "half-written",
    ];
    let (mut current, mut invalid_kept_out, mut slowest) = (current, 0, Duration::ZERO);
    let mut probes = 0u64;
    for rotation in 0..rotations {
        let kind = kinds[rotation % kinds.len()];
        let (cert, key) = match kind {
            "valid" => pair(&issuer, None),
            "expired" => pair(&issuer, Some((2020, 2021))),
            "not-yet-valid" => pair(&issuer, Some((2090, 2091))),
            "mismatched" => (pair(&issuer, None).0, pair(&issuer, None).1),
            _ => {
                let (cert, key) = pair(&issuer, None);
                (cert[..cert.len() / 2].to_owned(), key)
            }
        };
        let published = Instant::now();
        publish(&dir, &cert, &key);
        if kind == "valid" {
            valid.insert(CertificateDer::from_pem_slice(cert.as_bytes()).unwrap());
            // Served within the poll interval at the latest (the watch is quicker).
            loop {
                probes += 1;
                if let Ok(served) = review_seeing_leaf(options, body_of(&options.review)).await
                    && valid.contains(&served)
                    && served != current
                {
                    current = served;
                    slowest = slowest.max(published.elapsed());
                    break;
                }
                assert!(
                    published.elapsed() < Duration::from_secs(30),
                    "never served"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        } else {
            // Long enough for the watch to have seen it (it reacts within ~100 ms).
            tokio::time::sleep(Duration::from_millis(1500)).await;
            probes += 1;
            match review_seeing_leaf(options, body_of(&options.review)).await {
                Ok(served) if served == current => invalid_kept_out += 1,
                other => println!("rotation {rotation} ({kind}): served {:?}", other.is_ok()),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    load.await.unwrap();
    let seen = seen.lock().unwrap();
    let foreign = seen.leaves.iter().filter(|l| !valid.contains(*l)).count();
    let distinct: HashSet<_> = seen.leaves.iter().collect();
    println!(
        "rotate: {rotations} publications ({} valid), {} reviews on fresh connections, {} failed, \
         {foreign} served a certificate that was not a published valid one, {} distinct valid \
         certificates seen by the load; invalid pairs kept out: {invalid_kept_out} of {}; slowest \
         valid pair served {slowest:?} after publication; {} probe connections",
        valid.len() - 1,
        seen.answered,
        seen.failures.len(),
        distinct.len(),
        rotations - (valid.len() - 1),
        probes,
    );
    for failure in seen.failures.iter().take(5) {
        println!("  failure: {failure}");
    }
}

//! Benchmark: create 10,000 custom resources through a kube `Client` on the in-process router
//! while a dozen watchers stream them, then report the time taken and the resident memory.
//!
//! `cargo run --release -p kube-sandbox --example bench_10k [-- <objects> <watchers>]`

#[path = "../tests/it/support/fixtures.rs"]
mod fixtures;

use std::time::Instant;

use fixtures::{Widget, client, install_crd, widget};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube_sandbox::Sandbox;

fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let objects: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let watchers: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(12);
    let sandbox = Sandbox::builder().deployment_controller(false).build();
    let client = client(&sandbox);
    install_crd(&client).await;
    let widgets: Api<Widget> = Api::default_namespaced(client.clone());
    println!("rss before: {:.1} MiB", rss_mib().unwrap_or(f64::NAN));

    let mut watch_tasks = Vec::new();
    for _ in 0..watchers {
        let api = widgets.clone();
        watch_tasks.push(tokio::spawn(async move {
            let mut seen = 0usize;
            let mut stream = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = stream.try_next().await.expect("watch") {
                if let watcher::Event::Apply(_) | watcher::Event::InitApply(_) = event {
                    seen += 1;
                    if seen == objects {
                        break;
                    }
                }
            }
            seen
        }));
    }

    let start = Instant::now();
    futures::stream::iter(0..objects)
        .map(|i| {
            let api = widgets.clone();
            async move {
                api.create(
                    &PostParams::default(),
                    &widget(&format!("w-{i:05}"), 1, "benchmark"),
                )
                .await
                .expect("create")
            }
        })
        .buffer_unordered(16)
        .for_each(|_| async {})
        .await;
    let created = start.elapsed();
    for t in watch_tasks {
        let seen = t.await.expect("watcher task");
        assert_eq!(seen, objects, "every watcher saw every object");
    }
    let streamed = start.elapsed();
    println!(
        "created {objects} objects in {:.2?} ({:.0}/s)",
        created,
        objects as f64 / created.as_secs_f64()
    );
    println!("{watchers} watchers saw all of them after {:.2?}", streamed);
    println!("objects stored: {}", sandbox.object_count());
    println!("rss after: {:.1} MiB", rss_mib().unwrap_or(f64::NAN));
}

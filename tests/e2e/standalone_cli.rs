//! The README's first command, run as the real binary:
//! `tuna-operator standalone --demo -f examples/standalone` brings up public URLs
//! answering real content and says what to curl; SIGTERM stops it cleanly.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_quickstart_serves_and_stops_on_sigterm() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().unwrap();
    let tcp = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/standalone");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tuna-operator"))
        .args(["standalone", "--demo", "-f"])
        .arg(&examples)
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--tcp-port-range",
            &format!("{tcp}-{tcp}"),
            "--data-dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // Read the report until the "Try it" hint.
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let lines = tokio::time::timeout(WAIT, async {
        let mut lines = Vec::new();
        while let Some(line) = stdout.next_line().await.unwrap() {
            let done = line.starts_with("Try it:");
            lines.push(line);
            if done {
                return lines;
            }
        }
        panic!(
            "the command ended before printing its hint:\n{}",
            lines.join("\n")
        );
    })
    .await
    .expect("the command prints its report and a hint in time");
    let report = lines.join("\n");
    let hint = lines.last().unwrap();
    let url = hint
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("hint names a URL")
        .to_owned();
    let port: u16 = url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(url, format!("http://demo.localhost:{port}/"));
    for published in [
        format!("http://shop.localhost:{port}/api"),
        format!("http://web.localhost:{port}/"),
        format!("http://store.localhost:{port}/api"),
        format!("tcp://127.0.0.1:{tcp}"),
    ] {
        assert!(
            report.contains(&published),
            "{published} missing from\n{report}"
        );
    }
    assert!(!report.contains("Skipped"), "{report}");

    let edge = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let client = reqwest::Client::builder()
        .resolve("demo.localhost", edge)
        .build()
        .unwrap();
    let body = client.get(&url).send().await.unwrap().text().await.unwrap();
    assert!(
        body.contains("Hello from tuna-operator standalone!"),
        "{body}"
    );
    assert!(
        body.contains(&format!("x-forwarded-host: demo.localhost:{port}")),
        "{body}"
    );

    // SIGTERM: tunnels closed, tokens revoked, exit 0.
    let pid = child.id().unwrap().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = tokio::time::timeout(WAIT, child.wait())
        .await
        .expect("stops in time")
        .unwrap();
    assert!(exit.success(), "{exit:?}");
}

//! `kube-emulator`: start an in-memory Kubernetes API for development and tests.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use kube_emulator::{Emulator, Options};

/// In-memory Kubernetes API server that kubectl and kube-rs accept, with RBAC enforcement.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Write the admin kubeconfig to this file.
    #[arg(long)]
    kubeconfig_out: PathBuf,
    /// Port on 127.0.0.1 (0 = any free port).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Append audit entries (JSON lines) to this file.
    #[arg(long)]
    audit_log: Option<PathBuf>,
    /// Serve HTTPS with a generated CA embedded in the written kubeconfigs (the default).
    #[arg(long, conflicts_with = "plain_http")]
    tls: bool,
    /// Serve plain HTTP instead. kubectl sends no token over HTTP, so tokenless requests act
    /// as admin there: use TLS to check RBAC with kubectl.
    #[arg(long)]
    plain_http: bool,
    /// Manifests to load at start (files or directories; multi-document YAML).
    #[arg(short = 'f', long = "filename")]
    manifests: Vec<PathBuf>,
    /// Write a kubeconfig acting as a ServiceAccount: `NAMESPACE/NAME=FILE` (repeatable).
    #[arg(long, value_parser = parse_sa)]
    sa_kubeconfig: Vec<(String, String, PathBuf)>,
}

fn parse_sa(s: &str) -> Result<(String, String, PathBuf), String> {
    let (sa, file) = s.split_once('=').ok_or("expected NAMESPACE/NAME=FILE")?;
    let (ns, name) = sa.split_once('/').ok_or("expected NAMESPACE/NAME=FILE")?;
    Ok((ns.to_string(), name.to_string(), PathBuf::from(file)))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let opts = Options {
        bind: ([127, 0, 0, 1], args.port).into(),
        tls: args.tls || !args.plain_http,
        audit_log: args.audit_log,
        kubeconfig_out: Some(args.kubeconfig_out.clone()),
        manifests: args.manifests,
        ..Options::default()
    };
    let emu = Emulator::start(opts)
        .await
        .context("starting the emulator")?;
    for (ns, name, file) in &args.sa_kubeconfig {
        emu.write_service_account_kubeconfig(ns, name, file)
            .with_context(|| format!("writing {}", file.display()))?;
        println!("ServiceAccount {ns}/{name} kubeconfig: {}", file.display());
    }
    println!("kube-emulator listening on {}", emu.url());
    println!("admin kubeconfig: {}", args.kubeconfig_out.display());
    println!(
        "try: kubectl --kubeconfig {} get namespaces",
        args.kubeconfig_out.display()
    );
    tokio::signal::ctrl_c()
        .await
        .context("waiting for Ctrl-C")?;
    Ok(())
}

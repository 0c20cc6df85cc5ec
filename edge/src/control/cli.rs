//! `tuna-operator edge keys create|list|revoke`: API keys managed on the
//! edge's data dir, or in the fleet's PostgreSQL store (`--store`).
//!
//! The redb store allows one process at a time, so these commands run while
//! the edge is stopped; against a running edge they fail with a clear
//! message. The PostgreSQL store is shared: they run while the replicas
//! serve, and every replica accepts a key created this way within moments.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::keys;
use super::plane::DEFAULT_ACCOUNT;
use super::store::{Store, StoreUrl};
use tuna_protocol::api::Scope;

use crate::error::{Error, Result};

/// `edge keys …`.
#[derive(Debug, clap::Args)]
pub struct KeysArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: KeysCommand,
}

/// The `keys` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Creates a key and prints it once (only its hash is stored).
    Create(CreateKeyArgs),
    /// Lists keys (never their secrets).
    List(DataDirArgs),
    /// Revokes a key by id.
    Revoke(RevokeKeyArgs),
}

/// Where the edge's store is: its data dir, or the fleet's database.
#[derive(Debug, clap::Args)]
pub struct DataDirArgs {
    /// The edge's data directory (holds `control.redb`); ignored with
    /// `--store` (an environment shared with the edge may set both).
    #[arg(long, env = "TUNA_EDGE_DATA_DIR", required_unless_present = "store")]
    pub data_dir: Option<PathBuf>,
    /// The fleet's PostgreSQL store, `postgres://USER[:PASSWORD]@HOST:PORT/DB`,
    /// with `?sslmode=verify-full&sslrootcert=CA.pem` for a database on
    /// another machine (prefer the environment variable: a command line is
    /// visible to every local user).
    #[arg(
        long,
        env = "TUNA_EDGE_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub store: Option<StoreUrl>,
    /// Allow `sslmode=prefer` or `disable` in `--store` to a database on
    /// another machine (refused otherwise: the connection could be read or
    /// changed on its way, and every replica trusts what the store says).
    #[arg(long, env = "TUNA_EDGE_STORE_INSECURE_TLS")]
    pub store_insecure_tls: bool,
}

impl DataDirArgs {
    /// Opens the store these flags name. Blocks (PostgreSQL: connects and
    /// migrates); not on an async runtime's thread.
    pub fn open(&self) -> Result<Store> {
        match (&self.store, &self.data_dir) {
            (Some(store), _) => Store::open_at(
                Some(&store.clone().allowing_insecure_tls(self.store_insecure_tls)),
                Path::new(""),
            ),
            (None, Some(data_dir)) => Store::open(data_dir),
            (None, None) => Err(Error::ControlConfig(
                "give --data-dir (the edge's redb store) or --store postgres://…".into(),
            )),
        }
    }
}

/// `keys create`.
#[derive(Debug, clap::Args)]
pub struct CreateKeyArgs {
    /// The edge's data dir.
    #[command(flatten)]
    pub data_dir: DataDirArgs,
    /// A scope (repeatable): tunnels:write, tunnels:connect, or full.
    #[arg(
        long = "scope",
        value_name = "SCOPE",
        required_unless_present = "full_access"
    )]
    pub scopes: Vec<Scope>,
    /// Grants every scope (same as `--scope full`).
    #[arg(long)]
    pub full_access: bool,
    /// A name to recognise the key by in `keys list`.
    #[arg(long)]
    pub name: Option<String>,
    /// The account the key acts for; reservations belong to accounts.
    #[arg(long, default_value = DEFAULT_ACCOUNT)]
    pub account: String,
}

/// `keys revoke`.
#[derive(Debug, clap::Args)]
pub struct RevokeKeyArgs {
    /// The edge's data dir.
    #[command(flatten)]
    pub data_dir: DataDirArgs,
    /// The key id, as `keys list` shows it.
    pub id: String,
}

/// Runs a `keys` command. The created key goes alone on `out` (so scripts
/// can capture it); notes go to `note`. Blocks: not on an async runtime's
/// thread.
pub fn run(args: &KeysArgs, out: &mut dyn Write, note: &mut dyn Write) -> Result<()> {
    let io = |source: std::io::Error| Error::File {
        path: PathBuf::from("<stdout>"),
        source,
    };
    match &args.command {
        KeysCommand::Create(create) => {
            let store = create.data_dir.open()?;
            let mut scopes = create.scopes.clone();
            if create.full_access {
                scopes.push(Scope::Full);
            }
            let (key, secret) =
                keys::create_key(&store, &create.account, create.name.clone(), scopes)?;
            writeln!(
                note,
                "created API key {} for account {} with scopes {}; it is shown only once:",
                key.id,
                key.account,
                scope_list(&key.scopes)
            )
            .map_err(io)?;
            writeln!(out, "{}", secret.expose()).map_err(io)?;
        }
        KeysCommand::List(dir) => {
            let store = dir.open()?;
            writeln!(
                out,
                "{:<18} {:<12} {:<30} {:<22} NAME",
                "ID", "ACCOUNT", "SCOPES", "CREATED"
            )
            .map_err(io)?;
            for key in keys::list_keys(&store) {
                writeln!(
                    out,
                    "{:<18} {:<12} {:<30} {:<22} {}",
                    key.id,
                    key.account,
                    scope_list(&key.scopes),
                    key.created_at,
                    key.name.as_deref().unwrap_or("-")
                )
                .map_err(io)?;
            }
        }
        KeysCommand::Revoke(revoke) => {
            let store = revoke.data_dir.open()?;
            let (key, minted) = keys::revoke_key(&store, &revoke.id)?;
            writeln!(out, "revoked API key {} (account {})", key.id, key.account).map_err(io)?;
            if !minted.is_empty() {
                writeln!(
                    note,
                    "also revoked the {} tunnel token(s) the key minted",
                    minted.len()
                )
                .map_err(io)?;
            }
        }
    }
    Ok(())
}

fn scope_list(scopes: &[Scope]) -> String {
    scopes
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

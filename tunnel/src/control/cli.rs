//! `tuna-operator edge keys create|list|revoke`: API keys managed on the
//! edge's data dir.
//!
//! The store allows one process at a time, so these commands run while the
//! edge is stopped; against a running edge they fail with a clear message.

use std::io::Write;
use std::path::PathBuf;

use super::DEFAULT_ACCOUNT;
use super::error::{ControlError, Result};
use super::keys;
use super::store::Store;
use crate::api::Scope;

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

/// The edge's data dir.
#[derive(Debug, clap::Args)]
pub struct DataDirArgs {
    /// The edge's data directory (holds `control.redb`).
    #[arg(long, env = "TUNA_EDGE_DATA_DIR")]
    pub data_dir: PathBuf,
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
/// can capture it); notes go to `note`.
pub fn run(args: &KeysArgs, out: &mut dyn Write, note: &mut dyn Write) -> Result<()> {
    let io = |source: std::io::Error| ControlError::Io {
        path: PathBuf::from("<stdout>"),
        source,
    };
    match &args.command {
        KeysCommand::Create(create) => {
            let store = Store::open(&create.data_dir.data_dir)?;
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
            let store = Store::open(&dir.data_dir)?;
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
            let store = Store::open(&revoke.data_dir.data_dir)?;
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

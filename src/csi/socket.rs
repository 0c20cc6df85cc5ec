//! The CSI plugin's Unix sockets: one way to open them, for the plugin's
//! own (Identity and Node) and for the kubelet's registration API.

use std::path::Path;

use crate::Error;

fn io_error(what: &str, target: &Path, e: std::io::Error) -> Error {
    Error::CsiInternal(format!("{what} {}: {e}", target.display()))
}

/// Listens on the Unix socket `socket`, readable and writable by root only
/// (the kubelet runs as root): a stale socket file is replaced, its
/// directory made.
pub fn bind_socket(socket: &Path) -> crate::Result<tokio::net::UnixListener> {
    if let Some(parent) = socket.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| io_error("creating the socket's directory", parent, e))?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(io_error("removing the old socket", socket, e));
        }
        _ => {}
    }
    let listener =
        tokio::net::UnixListener::bind(socket).map_err(|e| io_error("listening on", socket, e))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        // The kubelet runs as root: no one else may call.
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_error("restricting", socket, e))?;
    }
    Ok(listener)
}

//! TCP endpoints: an alias reserves one public port of the edge's range.

use super::keys::Caller;
use super::names;
use super::plane::ControlPlane;
use super::store::{State, TcpRecord, Write};
use tuna_protocol::api::{CreateTcpEndpoint, Scope, TcpEndpoint, Timestamp};
use tuna_protocol::wire::BoundTarget;

use crate::authority::Revocation;
use crate::error::{Error, Result};

impl ControlPlane {
    pub(crate) fn tcp_view(&self, record: &TcpRecord) -> TcpEndpoint {
        TcpEndpoint {
            alias: record.alias.clone(),
            port: record.port,
            address: format!("{}:{}", self.public_host(), record.port),
            account: record.account.clone(),
            created_at: Timestamp(record.created_at),
        }
    }

    /// Reserves `alias` and a port (the requested one, or the lowest free).
    pub fn create_tcp_endpoint(
        &self,
        caller: &Caller,
        request: &CreateTcpEndpoint,
    ) -> Result<TcpEndpoint> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        let alias = names::tcp_alias(&request.alias)?;
        let range = self.tcp_port_range();
        if let Some(port) = request.port
            && !range.contains(&port)
        {
            return Err(Error::PortOutOfRange(format!(
                "port {port} lies outside this edge's TCP range {}-{}",
                range.start(),
                range.end()
            )));
        }
        let now = Timestamp::now().unix_seconds();
        self.store().commit(|state| {
            if let Some(existing) = state.tcp.get(&alias) {
                return Err(self.reservation_conflict(
                    caller,
                    &existing.account,
                    || {
                        (
                            format!(
                                "your account already holds the TCP endpoint {alias:?} (port {})",
                                existing.port
                            ),
                            serde_json::to_value(self.tcp_view(existing)),
                        )
                    },
                    &format!("the TCP endpoint alias {alias:?}"),
                ));
            }
            super::plane::check_quota(
                state.tcp_held(&caller.account),
                self.shared.quotas.tcp_endpoints,
                "TCP endpoints",
                "--quota-tcp-endpoints",
            )?;
            let port = match request.port {
                Some(port) => {
                    if let Some(holder) = state.tcp_by_port(port) {
                        return Err(self.reservation_conflict(
                            caller,
                            &holder.account,
                            || {
                                (
                                    format!(
                                        "your account already holds port {port} as {:?}",
                                        holder.alias
                                    ),
                                    serde_json::to_value(self.tcp_view(holder)),
                                )
                            },
                            &format!("port {port}"),
                        ));
                    }
                    port
                }
                None => self.free_port(state)?,
            };
            let record = TcpRecord {
                alias: alias.clone(),
                port,
                account: caller.account.clone(),
                created_at: now,
            };
            Ok((self.tcp_view(&record), vec![Write::PutTcp(record)]))
        })
    }

    /// The lowest port of the range that no endpoint holds.
    fn free_port(&self, state: &State) -> Result<u16> {
        let range = self.tcp_port_range();
        range
            .clone()
            .find(|p| state.tcp_by_port(*p).is_none())
            .ok_or_else(|| {
                Error::PortsExhausted(format!(
                    "every port of the range {}-{} is reserved; delete unused TCP endpoints",
                    range.start(),
                    range.end()
                ))
            })
    }

    /// The caller's TCP endpoints, sorted by alias.
    pub fn list_tcp_endpoints(&self, caller: &Caller) -> Result<Vec<TcpEndpoint>> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self
            .store()
            .read()
            .tcp
            .values()
            .filter(|t| t.account == caller.account)
            .map(|t| self.tcp_view(t))
            .collect())
    }

    /// Finds an endpoint of `account` by alias or by port number.
    pub(crate) fn find_tcp(state: &State, account: &str, alias_or_port: &str) -> Option<TcpRecord> {
        let found = match alias_or_port.parse::<u16>() {
            Ok(port) => state.tcp_by_port(port),
            Err(_) => state.tcp.get(&alias_or_port.to_ascii_lowercase()),
        };
        found.filter(|t| t.account == account).cloned()
    }

    fn own_tcp(&self, caller: &Caller, alias_or_port: &str) -> Result<TcpRecord> {
        Self::find_tcp(&self.store().read(), &caller.account, alias_or_port).ok_or_else(|| {
            Error::NotFound(format!(
                "your account holds no TCP endpoint {alias_or_port:?}"
            ))
        })
    }

    /// One of the caller's TCP endpoints, by alias or port.
    pub fn get_tcp_endpoint(&self, caller: &Caller, alias_or_port: &str) -> Result<TcpEndpoint> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self.tcp_view(&self.own_tcp(caller, alias_or_port)?))
    }

    /// Releases one of the caller's TCP endpoints; tunnels serving its port
    /// are closed at once (the port goes to the next allocation, maybe
    /// another account's).
    pub fn delete_tcp_endpoint(&self, caller: &Caller, alias_or_port: &str) -> Result<()> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        // Another replica may have made the endpoint a moment ago.
        self.store().sync()?;
        let record = self.own_tcp(caller, alias_or_port)?;
        self.store().commit(|state| {
            let writes = if state.tcp.get(&record.alias) == Some(&record) {
                vec![Write::DeleteTcp(record.alias.clone())]
            } else {
                Vec::new()
            };
            Ok(((), writes))
        })?;
        self.announce(Revocation::Target(BoundTarget::Tcp { port: record.port }));
        Ok(())
    }
}

//! Gateway addresses: an account reserves one address of the edge's pool
//! (`--gateway-addresses`) for one Gateway, and its tunnels may then bind
//! any port on it (`Binding::Address`).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::str::FromStr;

use super::keys::Caller;
use super::plane::ControlPlane;
use super::store::{AddressRecord, State, Write};
use tuna_protocol::api::{CreateGatewayAddress, GatewayAddress, Scope, Timestamp};

use crate::authority::Revocation;
use crate::error::{Error, Result};

/// The most addresses one range of `--gateway-addresses` may expand to, and
/// the most the whole pool may hold (an IPv4 /16, an IPv6 /112). A power
/// of two.
pub const MAX_POOL_ADDRESSES: usize = 1 << 16;

/// The addresses an edge hands out to Gateways (`--gateway-addresses`):
/// a comma-separated list of addresses and CIDR ranges, IPv4 and IPv6.
///
/// A range stands for every address in it, except that an IPv4 range wider
/// than a /31 leaves out its network and broadcast addresses (a /31 or /32,
/// and every IPv6 range, give all theirs). A range may expand to at most
/// [`MAX_POOL_ADDRESSES`], as may the whole list; a range with host bits
/// set (`10.0.0.5/24`) is refused. IPv4-mapped IPv6 addresses count as
/// their IPv4 address. Empty: no pool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPool(BTreeSet<IpAddr>);

impl AddressPool {
    /// Whether the edge has no Gateway addresses.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many addresses the pool holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether `address` is in the pool.
    pub fn contains(&self, address: IpAddr) -> bool {
        self.0.contains(&canonical(address))
    }

    /// The addresses, lowest first (every IPv4 one before the IPv6 ones).
    pub fn iter(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.0.iter().copied()
    }
}

impl FromStr for AddressPool {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut pool = BTreeSet::new();
        if s.trim().is_empty() {
            return Ok(Self(pool));
        }
        for entry in s.split(',').map(str::trim) {
            if entry.is_empty() {
                return Err(format!(
                    "{s:?} has an empty entry: list addresses and CIDR ranges separated by commas"
                ));
            }
            for address in expand(entry)? {
                pool.insert(address);
            }
            if pool.len() > MAX_POOL_ADDRESSES {
                return Err(format!(
                    "{s:?} holds more than {MAX_POOL_ADDRESSES} addresses; give fewer"
                ));
            }
        }
        Ok(Self(pool))
    }
}

/// The addresses one entry of the list stands for.
fn expand(entry: &str) -> Result<Vec<IpAddr>, String> {
    let bad = || format!("{entry:?} is neither an IP address nor a CIDR range (ADDRESS/PREFIX)");
    let Some((address, prefix)) = entry.split_once('/') else {
        return Ok(vec![canonical(address_of(entry).ok_or_else(bad)?)]);
    };
    let address = address_of(address).ok_or_else(bad)?;
    let prefix: u32 = prefix.trim().parse().map_err(|_| bad())?;
    let (bits, base): (u32, u128) = match address {
        IpAddr::V4(v4) => (32, u32::from(v4).into()),
        IpAddr::V6(v6) => (128, u128::from(v6)),
    };
    let host_bits = bits.checked_sub(prefix).ok_or_else(bad)?;
    let size_bits = MAX_POOL_ADDRESSES.trailing_zeros();
    if host_bits > size_bits {
        return Err(format!(
            "{entry:?} holds more than {MAX_POOL_ADDRESSES} addresses; give a /{} or narrower",
            bits - size_bits
        ));
    }
    let size = 1u128 << host_bits;
    if base & (size - 1) != 0 {
        return Err(format!(
            "{entry:?} has host bits set; give the network's first address, or the address alone"
        ));
    }
    // IPv4 networks wider than a /31 keep their network and broadcast
    // addresses out.
    let (first, last) = if bits == 32 && host_bits > 1 {
        (base + 1, base + size - 2)
    } else {
        (base, base + size - 1)
    };
    Ok((first..=last)
        .map(|n| match u32::try_from(n) {
            Ok(v4) if bits == 32 => IpAddr::V4(v4.into()),
            _ => canonical(IpAddr::V6(n.into())),
        })
        .collect())
}

fn address_of(text: &str) -> Option<IpAddr> {
    text.trim().parse().ok()
}

/// An IPv4-mapped IPv6 address as its IPv4 address; others unchanged.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// A Gateway address's label: 1–253 printable ASCII characters, no spaces.
fn gateway_name(name: &str) -> Result<String> {
    let printable = name.bytes().all(|b| b.is_ascii_graphic());
    if name.is_empty() || name.len() > 253 || !printable {
        return Err(Error::InvalidName(format!(
            "{name:?} is not a Gateway address name: give 1 to 253 printable ASCII characters without spaces (e.g. namespace/gateway)"
        )));
    }
    Ok(name.to_owned())
}

fn no_pool() -> Error {
    Error::NoAddressPool(
        "this edge has no Gateway addresses; start it with --gateway-addresses (addresses or CIDR ranges)"
            .to_owned(),
    )
}

impl ControlPlane {
    pub(crate) fn address_view(record: &AddressRecord) -> GatewayAddress {
        GatewayAddress {
            address: record.address,
            name: record.name.clone(),
            account: record.account.clone(),
            created_at: Timestamp(record.created_at),
        }
    }

    /// The pool Gateway addresses are reserved from.
    pub fn gateway_addresses(&self) -> &AddressPool {
        &self.shared.gateway_addresses
    }

    /// Reserves an address of the pool (the requested one, or the lowest
    /// free) under `name`. A second reservation under a name the account
    /// already uses, or of an address it already holds, is
    /// `409 already_exists` with the one it holds.
    pub fn create_gateway_address(
        &self,
        caller: &Caller,
        request: &CreateGatewayAddress,
    ) -> Result<GatewayAddress> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        let name = gateway_name(&request.name)?;
        let pool = self.gateway_addresses();
        if pool.is_empty() {
            return Err(no_pool());
        }
        let requested = request.address.map(canonical);
        if let Some(address) = requested
            && !pool.contains(address)
        {
            return Err(Error::AddressOutOfPool(format!(
                "{address} is not one of this edge's Gateway addresses (--gateway-addresses); leave the address out to get a free one"
            )));
        }
        let now = Timestamp::now().unix_seconds();
        self.store().commit(|state| {
            let already = |held: &AddressRecord, message: String| Error::AlreadyExists {
                message,
                existing: Box::new(
                    serde_json::to_value(Self::address_view(held))
                        .unwrap_or(serde_json::Value::Null),
                ),
            };
            if let Some(held) = state
                .addresses
                .values()
                .find(|a| a.account == caller.account && a.name == name)
            {
                return Err(already(
                    held,
                    format!(
                        "your account already holds the Gateway address {} as {name:?}",
                        held.address
                    ),
                ));
            }
            if let Some(address) = requested
                && let Some(holder) = state.addresses.get(&address)
            {
                return Err(self.reservation_conflict(
                    caller,
                    &holder.account,
                    || {
                        (
                            format!(
                                "your account already holds the Gateway address {address} as {:?}",
                                holder.name
                            ),
                            serde_json::to_value(Self::address_view(holder)),
                        )
                    },
                    &format!("the Gateway address {address}"),
                ));
            }
            super::plane::check_quota(
                state.addresses_held(&caller.account),
                self.shared.quotas.gateway_addresses,
                "Gateway addresses",
                "--quota-gateway-addresses",
            )?;
            let address = match requested {
                Some(address) => address,
                None => self.free_address(state)?,
            };
            let record = AddressRecord {
                address,
                name: name.clone(),
                account: caller.account.clone(),
                created_at: now,
            };
            Ok((Self::address_view(&record), vec![Write::PutAddress(record)]))
        })
    }

    /// The lowest address of the pool that no account holds.
    fn free_address(&self, state: &State) -> Result<IpAddr> {
        let pool = self.gateway_addresses();
        pool.iter()
            .find(|a| !state.addresses.contains_key(a))
            .ok_or_else(|| {
                Error::AddressesExhausted(format!(
                    "every one of this edge's {} Gateway addresses is reserved; delete unused ones",
                    pool.len()
                ))
            })
    }

    /// The caller's Gateway addresses, sorted by address.
    pub fn list_gateway_addresses(&self, caller: &Caller) -> Result<Vec<GatewayAddress>> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(self
            .store()
            .read()
            .addresses
            .values()
            .filter(|a| a.account == caller.account)
            .map(Self::address_view)
            .collect())
    }

    fn own_address(&self, caller: &Caller, address: &str) -> Result<AddressRecord> {
        let missing =
            || Error::NotFound(format!("your account holds no Gateway address {address:?}"));
        let ip = canonical(address.trim().parse::<IpAddr>().map_err(|_| missing())?);
        self.store()
            .read()
            .addresses
            .get(&ip)
            .filter(|a| a.account == caller.account)
            .cloned()
            .ok_or_else(missing)
    }

    /// One of the caller's Gateway addresses.
    pub fn get_gateway_address(&self, caller: &Caller, address: &str) -> Result<GatewayAddress> {
        caller.require_any(&[Scope::TunnelsWrite, Scope::TunnelsConnect])?;
        Ok(Self::address_view(&self.own_address(caller, address)?))
    }

    /// Gives one of the caller's Gateway addresses back to the pool; every
    /// tunnel binding a port on it is closed at once (the address goes to
    /// the next reservation, maybe another account's).
    pub fn delete_gateway_address(&self, caller: &Caller, address: &str) -> Result<()> {
        caller.require_any(&[Scope::TunnelsWrite])?;
        // Another replica may have reserved it a moment ago.
        self.store().sync()?;
        let record = self.own_address(caller, address)?;
        self.store().commit(|state| {
            let writes = if state.addresses.get(&record.address) == Some(&record) {
                vec![Write::DeleteAddress(record.address)]
            } else {
                Vec::new()
            };
            Ok(((), writes))
        })?;
        self.announce(Revocation::Address(record.address));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ControlConfig;
    use tuna_protocol::api::{Bindings, CreateToken};
    use tuna_protocol::wire::{Binding, BoundTarget, ErrorCode};

    fn config(dir: &std::path::Path, pool: &str) -> ControlConfig {
        let mut config = ControlConfig::new(dir, "tuna.test", "edge.tuna.test");
        config.gateway_addresses = pool.parse().unwrap();
        config
    }

    fn caller(account: &str) -> Caller {
        Caller {
            key_id: format!("k-{account}"),
            account: account.to_owned(),
            scopes: vec![Scope::TunnelsWrite],
        }
    }

    fn request(name: &str, address: Option<&str>) -> CreateGatewayAddress {
        CreateGatewayAddress {
            name: name.to_owned(),
            address: address.map(|a| a.parse().unwrap()),
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn reservations_take_the_lowest_free_address_and_deletes_give_it_back() {
        let dir = tempfile::tempdir().unwrap();
        let plane = ControlPlane::open(config(dir.path(), "10.9.0.0/29")).unwrap();
        let (ours, theirs) = (caller("ours"), caller("theirs"));
        let first = plane
            .create_gateway_address(&ours, &request("ns/a", None))
            .unwrap();
        assert_eq!(first.address, ip("10.9.0.1"));
        assert_eq!(
            (first.name.as_str(), first.account.as_str()),
            ("ns/a", "ours")
        );
        let second = plane
            .create_gateway_address(&theirs, &request("ns/a", None))
            .unwrap();
        assert_eq!(second.address, ip("10.9.0.2"));
        let picked = plane
            .create_gateway_address(&ours, &request("ns/c", Some("10.9.0.5")))
            .unwrap();
        assert_eq!(picked.address, ip("10.9.0.5"));
        let listed: Vec<IpAddr> = plane
            .list_gateway_addresses(&ours)
            .unwrap()
            .iter()
            .map(|a| a.address)
            .collect();
        assert_eq!(listed, [ip("10.9.0.1"), ip("10.9.0.5")]);
        assert_eq!(
            plane.get_gateway_address(&ours, "10.9.0.5").unwrap(),
            picked
        );
        assert!(matches!(
            plane.get_gateway_address(&theirs, "10.9.0.5"),
            Err(Error::NotFound(_))
        ));
        assert!(matches!(
            plane.delete_gateway_address(&theirs, "10.9.0.1"),
            Err(Error::NotFound(_))
        ));

        // Given back, the lowest address is the next one handed out.
        let mut revocations = plane.subscribe_revocations();
        plane.delete_gateway_address(&ours, "10.9.0.1").unwrap();
        assert!(matches!(
            revocations.try_recv(),
            Ok(Revocation::Address(a)) if a == ip("10.9.0.1")
        ));
        assert!(matches!(
            plane.get_gateway_address(&ours, "10.9.0.1"),
            Err(Error::NotFound(_))
        ));
        let again = plane
            .create_gateway_address(&theirs, &request("ns/b", None))
            .unwrap();
        assert_eq!(again.address, ip("10.9.0.1"));
    }

    #[test]
    fn requests_outside_the_pool_taken_or_over_quota_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), "192.0.2.10,192.0.2.11,192.0.2.12");
        config.quotas.gateway_addresses = 2;
        let plane = ControlPlane::open(config).unwrap();
        let (ours, theirs) = (caller("ours"), caller("theirs"));
        assert!(matches!(
            plane.create_gateway_address(&ours, &request("gw", Some("192.0.2.13"))),
            Err(Error::AddressOutOfPool(m)) if m.contains("--gateway-addresses")
        ));
        assert!(matches!(
            plane.create_gateway_address(&ours, &request("with space", None)),
            Err(Error::InvalidName(_))
        ));
        let held = plane
            .create_gateway_address(&ours, &request("gw", Some("192.0.2.11")))
            .unwrap();
        // Another account: refused; ours again (by address or by name): 409
        // with the reservation, so a retry adopts it.
        assert!(matches!(
            plane.create_gateway_address(&theirs, &request("gw", Some("192.0.2.11"))),
            Err(Error::HeldByOtherAccount(_))
        ));
        for retry in [request("gw", None), request("other", Some("192.0.2.11"))] {
            match plane.create_gateway_address(&ours, &retry) {
                Err(Error::AlreadyExists { existing, .. }) => assert_eq!(
                    serde_json::from_value::<GatewayAddress>(*existing).unwrap(),
                    held
                ),
                other => panic!("{retry:?}: {other:?}"),
            }
        }
        plane
            .create_gateway_address(&ours, &request("gw2", None))
            .unwrap();
        assert!(matches!(
            plane.create_gateway_address(&ours, &request("gw3", None)),
            Err(Error::QuotaExceeded(m)) if m.contains("--quota-gateway-addresses")
        ));
        assert_eq!(
            plane
                .create_gateway_address(&theirs, &request("gw", None))
                .unwrap()
                .address,
            ip("192.0.2.12")
        );
        assert!(matches!(
            plane.create_gateway_address(&caller("third"), &request("gw", None)),
            Err(Error::AddressesExhausted(_))
        ));
        // Reading needs a tunnels scope; writing tunnels:write.
        let reader = Caller {
            scopes: vec![Scope::TunnelsConnect],
            ..caller("ours")
        };
        assert_eq!(plane.list_gateway_addresses(&reader).unwrap().len(), 2);
        assert!(matches!(
            plane.create_gateway_address(&reader, &request("gw9", None)),
            Err(Error::MissingScope(_))
        ));
        assert!(matches!(
            plane.delete_gateway_address(&reader, "192.0.2.11"),
            Err(Error::MissingScope(_))
        ));
    }

    #[test]
    fn without_a_pool_the_answer_names_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let plane = ControlPlane::open(config(dir.path(), "")).unwrap();
        assert!(matches!(
            plane.create_gateway_address(&caller("ours"), &request("gw", None)),
            Err(Error::NoAddressPool(m)) if m.contains("--gateway-addresses")
        ));
    }

    #[test]
    fn reservations_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let held = {
            let plane = ControlPlane::open(config(dir.path(), "2001:db8::/126")).unwrap();
            let held = plane
                .create_gateway_address(&caller("ours"), &request("ns/gw", None))
                .unwrap();
            plane
                .create_gateway_address(&caller("ours"), &request("ns/gone", None))
                .unwrap();
            plane
                .delete_gateway_address(&caller("ours"), "2001:db8::1")
                .unwrap();
            held
        };
        let plane = ControlPlane::open(config(dir.path(), "2001:db8::/126")).unwrap();
        assert_eq!(
            plane.list_gateway_addresses(&caller("ours")).unwrap(),
            std::slice::from_ref(&held)
        );
        assert_eq!(held.address, ip("2001:db8::"));
        // The index was rebuilt: the quota counts it, the pool skips it.
        assert_eq!(plane.store().read().addresses_held("ours"), 1);
        assert_eq!(
            plane
                .create_gateway_address(&caller("theirs"), &request("x", None))
                .unwrap()
                .address,
            ip("2001:db8::1")
        );
    }

    #[test]
    fn a_held_address_binds_any_port_for_its_account_and_its_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let plane = ControlPlane::open(config(dir.path(), "10.9.0.8/30")).unwrap();
        let (ours, theirs) = (caller("ours"), caller("theirs"));
        let held = plane
            .create_gateway_address(&ours, &request("ns/gw", None))
            .unwrap()
            .address;
        let foreign = plane
            .create_gateway_address(&theirs, &request("ns/gw", None))
            .unwrap()
            .address;
        let (_, key) = plane
            .create_key("ours", None, vec![Scope::TunnelsConnect])
            .unwrap();
        let key_grant = plane.authenticate_tunnel(key.expose()).unwrap();
        let token = |addresses: Vec<IpAddr>| {
            let created = plane
                .create_token(
                    &ours,
                    &CreateToken {
                        bindings: Bindings {
                            addresses,
                            ..Bindings::default()
                        },
                        ..CreateToken::default()
                    },
                )
                .unwrap();
            plane.authenticate_tunnel(created.token.expose()).unwrap()
        };
        let named = token(vec![held]);
        let unnamed = token(Vec::new());
        let bind = |grant, address, port| {
            plane.check_tunnel_binding(grant, &Binding::Address { address, port })
        };
        for grant in [&key_grant, &named] {
            for port in [1, 80, 443, 65535] {
                assert_eq!(
                    bind(grant, held, port).unwrap(),
                    BoundTarget::Address {
                        address: held,
                        port
                    }
                );
            }
        }
        let refused = |result: Result<BoundTarget, tuna_protocol::wire::Rejection>, says: &str| {
            let rejection = result.unwrap_err();
            assert_eq!(
                rejection.code,
                ErrorCode::BindingNotAllowed,
                "{rejection:?}"
            );
            assert!(rejection.message.contains(says), "{rejection:?}");
        };
        refused(bind(&key_grant, held, 0), "port 0");
        refused(
            bind(&key_grant, foreign, 80),
            "reserve it with POST /v1/gateway-addresses",
        );
        refused(
            bind(&key_grant, ip("10.9.0.99"), 80),
            "reserve it with POST /v1/gateway-addresses",
        );
        refused(
            bind(&unnamed, held, 80),
            "was not created for the Gateway address",
        );

        // Given back: the binding is refused from then on.
        plane
            .delete_gateway_address(&ours, &held.to_string())
            .unwrap();
        refused(
            bind(&named, held, 80),
            "reserve it with POST /v1/gateway-addresses",
        );
    }

    fn pool(s: &str) -> Vec<String> {
        s.parse::<AddressPool>()
            .unwrap()
            .iter()
            .map(|a| a.to_string())
            .collect()
    }

    #[test]
    fn the_pool_expands_addresses_and_ranges() {
        assert!(pool("").is_empty());
        assert_eq!(
            pool("203.0.113.11, 203.0.113.10,203.0.113.10"),
            ["203.0.113.10", "203.0.113.11"]
        );
        // Network and broadcast addresses stay out of IPv4 ranges wider than /31.
        assert_eq!(pool("10.0.0.0/30"), ["10.0.0.1", "10.0.0.2"],);
        assert_eq!(pool("10.0.0.0/31"), ["10.0.0.0", "10.0.0.1"]);
        assert_eq!(pool("10.0.0.7/32"), ["10.0.0.7"]);
        assert_eq!(pool("127.0.100.0/24").len(), 254);
        assert_eq!(
            pool("2001:db8::/127,::ffff:192.0.2.1"),
            ["192.0.2.1", "2001:db8::", "2001:db8::1"]
        );
        assert_eq!(pool("10.0.0.0/16").len(), 65_534);
        assert_eq!(pool("2001:db8::/112").len(), 65_536);
    }

    #[test]
    fn a_bad_pool_is_refused_with_the_reason() {
        for (bad, says) in [
            ("10.0.0.1,,10.0.0.2", "empty entry"),
            ("gateway", "neither an IP address nor a CIDR range"),
            ("10.0.0.0/33", "neither an IP address nor a CIDR range"),
            ("10.0.0.0/x", "neither an IP address nor a CIDR range"),
            (
                "10.0.0.0/15",
                "more than 65536 addresses; give a /16 or narrower",
            ),
            (
                "2001:db8::/64",
                "more than 65536 addresses; give a /112 or narrower",
            ),
            ("10.0.0.5/24", "host bits set"),
            (
                "10.0.0.0/16,10.1.0.0/16,10.2.0.0/30",
                "more than 65536 addresses; give fewer",
            ),
        ] {
            let error = bad.parse::<AddressPool>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }

    #[test]
    fn names_are_printable_ascii_without_spaces() {
        assert!(gateway_name("default/edge-gw").is_ok());
        assert!(gateway_name(&"a".repeat(253)).is_ok());
        for bad in ["", "a b", "tab\there", "é", &"a".repeat(254)] {
            assert!(
                matches!(gateway_name(bad), Err(Error::InvalidName(_))),
                "{bad:?}"
            );
        }
    }
}

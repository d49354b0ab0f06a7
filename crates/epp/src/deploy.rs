//! The Envoy configuration the picker is run behind (`deploy/envoy-epp.yaml`, the Inference
//! Extension's reference setup), for whatever starts an Envoy in front of a picker on other
//! ports: the tests and the benchmarks run this same file.

/// `deploy/envoy-epp.yaml`, as shipped.
pub const ENVOY_YAML: &str = include_str!("../../../deploy/envoy-epp.yaml");

/// Where things listen, and how the picker is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvoyFront {
    /// Envoy's listener for clients.
    pub listen: u16,
    /// Envoy's admin listener.
    pub admin: u16,
    /// The picker's `--grpc-port` on 127.0.0.1.
    pub picker: u16,
    /// The picker serves TLS (`--secure-serving`, its default).
    pub tls: bool,
    /// Envoy's `failure_mode_allow`.
    pub failure_mode_allow: bool,
}

/// What the shipped file no longer has, when it changed under this code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("deploy/envoy-epp.yaml no longer has `{0}`")]
pub struct Drifted(pub &'static str);

/// `ENVOY_YAML` for `front`.
pub fn envoy_yaml(front: EnvoyFront) -> Result<String, Drifted> {
    let mut text = ENVOY_YAML.to_string();
    let picker = front.picker;
    for (from, to) in [
        ("port_value: 19000", format!("port_value: {}", front.admin)),
        ("port_value: 8081", format!("port_value: {}", front.listen)),
        ("port_value: 9002", format!("port_value: {picker}")),
        ("localhost:9002", format!("localhost:{picker}")),
        (
            "failure_mode_allow: false",
            format!("failure_mode_allow: {}", front.failure_mode_allow),
        ),
    ] {
        if !text.contains(from) {
            return Err(Drifted(from));
        }
        text = text.replace(from, &to);
    }
    if !front.tls {
        // The ext_proc cluster's `transport_socket` block, to the end of its validation context.
        const START: &str = "      transport_socket:";
        const END: &str = "validation_context: {}\n";
        let start = text.find(START).ok_or(Drifted(START))?;
        let end = text[start..].find(END).ok_or(Drifted(END))? + start + END.len();
        text.replace_range(start..end, "");
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ports_and_the_transport_are_replaced() {
        let front = EnvoyFront {
            listen: 1,
            admin: 2,
            picker: 3,
            tls: false,
            failure_mode_allow: true,
        };
        let yaml = envoy_yaml(front).unwrap();
        for line in [
            "port_value: 1 }",
            "port_value: 2 }",
            "port_value: 3 }",
            "authority: localhost:3",
            "failure_mode_allow: true",
        ] {
            assert!(yaml.contains(line), "{line} missing:\n{yaml}");
        }
        assert!(!yaml.contains("UpstreamTlsContext"));
        let with_tls = envoy_yaml(EnvoyFront { tls: true, ..front }).unwrap();
        assert!(with_tls.contains("UpstreamTlsContext"));
    }
}

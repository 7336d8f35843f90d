//! `ListMachinesResponse`, written by hand instead of generated, so that the server can send
//! rows it encoded once.
//!
//! The wire format is exactly the generated one (`message ListMachinesResponse { repeated
//! Machine machines = 1; }`): a `repeated` message field is the concatenation of its entries,
//! each a field-1 key, a length and the `Machine`'s bytes, so one cluster's entries encoded once
//! and written again verbatim are the bytes prost would write for the same rows. Clients decode
//! it as any message (`build.rs` maps the proto type here with `extern_path`, for the server,
//! the client and the generated service code alike).

use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{DecodeContext, WireType};

use super::pb::Machine;

/// Rows of one cluster, with their field-1 entries already encoded.
#[derive(Debug, PartialEq)]
pub struct EncodedRows {
    rows: Vec<Machine>,
    encoded: Vec<u8>,
}

impl EncodedRows {
    /// Encode `rows` once; the response writes these bytes as they are.
    pub fn new(rows: Vec<Machine>) -> EncodedRows {
        let len: usize = rows
            .iter()
            .map(|m| prost::encoding::message::encoded_len(1, m))
            .sum();
        let mut encoded = Vec::with_capacity(len);
        for m in &rows {
            prost::encoding::message::encode(1, m, &mut encoded);
        }
        EncodedRows { rows, encoded }
    }
    pub fn rows(&self) -> &[Machine] {
        &self.rows
    }
    /// The encoded entries' size in bytes.
    pub fn encoded_len(&self) -> usize {
        self.encoded.len()
    }
}

/// The machines `ListMachines` answers with: rows decoded or built one by one, then the
/// server's pre-encoded clusters, in that order (the server uses only the latter, a decoded
/// response only the former). Two responses are equal when they list the same machines in the
/// same order, however they hold them.
#[derive(Debug, Clone, Default)]
pub struct ListMachinesResponse {
    machines: Vec<Machine>,
    encoded: Vec<Arc<EncodedRows>>,
}

impl ListMachinesResponse {
    pub fn from_rows(machines: Vec<Machine>) -> ListMachinesResponse {
        ListMachinesResponse {
            machines,
            encoded: Vec::new(),
        }
    }
    /// A response made of already encoded clusters (each shared with a cache).
    pub fn from_encoded(encoded: Vec<Arc<EncodedRows>>) -> ListMachinesResponse {
        ListMachinesResponse {
            machines: Vec::new(),
            encoded,
        }
    }
    /// Every machine, in wire order.
    pub fn machines(&self) -> impl Iterator<Item = &Machine> {
        self.machines
            .iter()
            .chain(self.encoded.iter().flat_map(|e| e.rows.iter()))
    }
    pub fn len(&self) -> usize {
        self.machines.len() + self.encoded.iter().map(|e| e.rows.len()).sum::<usize>()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Every machine, in wire order, owned.
    pub fn into_machines(self) -> Vec<Machine> {
        let mut out = self.machines;
        for e in &self.encoded {
            out.extend(e.rows.iter().cloned());
        }
        out
    }
}

impl PartialEq for ListMachinesResponse {
    fn eq(&self, other: &ListMachinesResponse) -> bool {
        self.len() == other.len() && self.machines().eq(other.machines())
    }
}

impl prost::Message for ListMachinesResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        for m in &self.machines {
            prost::encoding::message::encode(1, m, buf);
        }
        for e in &self.encoded {
            buf.put_slice(&e.encoded);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        match tag {
            1 => prost::encoding::message::merge_repeated(wire_type, &mut self.machines, buf, ctx)
                .map_err(|mut e| {
                    e.push("ListMachinesResponse", "machines");
                    e
                }),
            _ => prost::encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        self.machines
            .iter()
            .map(|m| prost::encoding::message::encoded_len(1, m))
            .sum::<usize>()
            + self.encoded.iter().map(|e| e.encoded.len()).sum::<usize>()
    }

    fn clear(&mut self) {
        self.machines.clear();
        self.encoded.clear();
    }
}

impl serde::Serialize for ListMachinesResponse {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct All<'a>(&'a ListMachinesResponse);
        impl serde::Serialize for All<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.machines())
            }
        }
        let mut st = s.serialize_struct("ListMachinesResponse", 1)?;
        st.serialize_field("machines", &All(self))?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn m(cluster: &str, node: &str) -> Machine {
        Machine {
            cluster: cluster.into(),
            pool: "workers".into(),
            node: node.into(),
            id: format!("id-{node}"),
            address: "10.0.0.1".into(),
            role: "worker".into(),
            talos_version: "v1.13.0".into(),
            kubelet_version: String::new(),
            ready: true,
            cordoned: false,
            reachable: node.len() % 2 == 0,
        }
    }

    /// The generated message this type stands in for, as prost derives it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Generated {
        #[prost(message, repeated, tag = "1")]
        machines: Vec<Machine>,
    }

    #[test]
    fn pre_encoded_rows_are_the_generated_wire_bytes_and_decode_back() {
        let a = vec![m("a", "n1"), m("a", "node-22")];
        let b = vec![m("b", "x")];
        let all: Vec<Machine> = a.iter().chain(&b).cloned().collect();
        let generated = Generated {
            machines: all.clone(),
        }
        .encode_to_vec();
        let pre = ListMachinesResponse::from_encoded(vec![
            Arc::new(EncodedRows::new(a)),
            Arc::new(EncodedRows::new(Vec::new())),
            Arc::new(EncodedRows::new(b)),
        ]);
        assert_eq!(pre.encode_to_vec(), generated);
        assert_eq!(pre.encoded_len(), generated.len());
        assert_eq!(pre.len(), 3);
        let decoded = ListMachinesResponse::decode(generated.as_slice()).unwrap();
        assert_eq!(decoded.machines().cloned().collect::<Vec<_>>(), all);
        assert_eq!(decoded, pre);
        assert_ne!(decoded, ListMachinesResponse::from_rows(all[..2].to_vec()));
        assert_eq!(pre.clone().into_machines(), all);
        // Rows built one by one encode the same way too.
        assert_eq!(
            ListMachinesResponse::from_rows(all.clone()).encode_to_vec(),
            generated
        );
        assert_eq!(
            serde_json::to_value(&pre).unwrap(),
            serde_json::to_value(&decoded).unwrap()
        );
        assert_eq!(
            serde_json::to_value(&decoded).unwrap()["machines"][2]["node"],
            "x"
        );
    }
}

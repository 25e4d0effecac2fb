//! Writing commands in RESP, for the few the store sends on every request: the gateway
//! knows their arguments' lengths up front and writes them straight into one buffer.

/// Appends `args` as one command.
pub(crate) fn command(out: &mut Vec<u8>, args: &[&[u8]]) {
    let mut n = itoa::Buffer::new();
    out.push(b'*');
    out.extend_from_slice(n.format(args.len()).as_bytes());
    out.extend_from_slice(b"\r\n");
    for arg in args {
        out.push(b'$');
        out.extend_from_slice(n.format(arg.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// Room for `args` as one command: their bytes and at most 16 of framing each.
pub(crate) fn room(args: &[&[u8]]) -> usize {
    16 + args.iter().map(|a| a.len() + 16).sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_the_crate_writes() {
        let samples: &[&[&[u8]]] = &[
            &[b"MULTI"],
            &[
                b"SET",
                b"k",
                b"\x00\x01\r\n",
                b"NX",
                b"PX",
                b"12345",
                b"GET",
            ],
            &[b"GET", b""],
        ];
        for args in samples {
            let mut ours = Vec::new();
            command(&mut ours, args);
            assert!(ours.len() <= room(args));
            let mut cmd = redis::Cmd::new();
            for a in *args {
                cmd.arg(*a);
            }
            assert_eq!(ours, cmd.get_packed_command(), "{args:?}");
        }
    }
}

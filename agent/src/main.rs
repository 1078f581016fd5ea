static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ember"));
fn main() {
    let mut bpf = aya::Ebpf::load(OBJ).unwrap();
    for (n, _) in bpf.programs() { println!("{n}"); }
    let _ = &mut bpf;
}

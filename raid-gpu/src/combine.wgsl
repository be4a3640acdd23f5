// One kernel for every RAID5/6 parity operation: each task writes one output
// chunk as a GF(2^8) (poly 0x11d) linear combination of source chunks.
// The CPU side (plan.rs) works out the coefficients; this only does the sums.
//
// Chunks are processed 16 bytes (a vec4<u32>, 16 field elements) per thread
// per step. Offsets and lengths below are in those 16-byte units.
//
// plan layout (u32 words):
//   tasks, 8 words each, task t at t*8:
//     [0] out offset  [1] length  [2] first term's word index  [3] terms
//     [4] 1 = Horner form (Q of data chunks), 0 = linear   [5..8] unused
//   terms, 2 words each: [0] source offset  [1] coefficient (0..255)

@group(0) @binding(0) var<storage, read> plan: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

// Multiply 16 field elements by 2 (g): shift each byte left, reduce the
// bytes whose top bit fell out by 0x1d. The product hi * 0x1d stays within
// its byte because hi is 0 or 1 there.
fn xtime(v: vec4<u32>) -> vec4<u32> {
    let hi = (v >> vec4<u32>(7u)) & vec4<u32>(0x01010101u);
    return ((v << vec4<u32>(1u)) & vec4<u32>(0xfefefefeu)) ^ (hi * 0x1du);
}

// c * v for a constant c: the sum of v * 2^b over the set bits b of c. The
// branch depends on c only, the same for every thread of a task.
fn gf_mul(v: vec4<u32>, c: u32) -> vec4<u32> {
    var r = vec4<u32>(0u);
    var t = v;
    for (var b = 0u; b < 8u; b = b + 1u) {
        if (((c >> b) & 1u) == 1u) {
            r = r ^ t;
        }
        t = xtime(t);
    }
    return r;
}

@compute @workgroup_size(64)
fn combine(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let t = gid.y * 8u;
    let out_off = plan[t];
    let len = plan[t + 1u];
    let first = plan[t + 2u];
    let n = plan[t + 3u];
    let horner = plan[t + 4u];
    // Grid-stride: a chunk longer than the dispatch is covered in steps.
    let stride = groups.x * 64u;
    for (var w = gid.x; w < len; w = w + stride) {
        var acc = vec4<u32>(0u);
        if (horner == 1u) {
            for (var i = n; i > 0u; i = i - 1u) {
                acc = xtime(acc) ^ src[plan[first + 2u * (i - 1u)] + w];
            }
        } else {
            for (var i = 0u; i < n; i = i + 1u) {
                let v = src[plan[first + 2u * i] + w];
                let c = plan[first + 2u * i + 1u];
                if (c == 1u) {
                    acc = acc ^ v;
                } else {
                    acc = acc ^ gf_mul(v, c);
                }
            }
        }
        dst[out_off + w] = acc;
    }
}

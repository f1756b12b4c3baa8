// Float weight rows: load4(rb, i) is elements 4i..4i+3 of the row at byte
// address rb, as f32. One definition per type; the engine keeps one (TYPE).
//#if f32
fn load4(rb: u32, i: u32) -> vec4<f32> {
  let a = rb + 16u * i;
  return vec4<f32>(bitcast<f32>(ld32(a)), bitcast<f32>(ld32(a + 4u)), bitcast<f32>(ld32(a + 8u)), bitcast<f32>(ld32(a + 12u)));
}
//#endif
//#if f16
fn load4(rb: u32, i: u32) -> vec4<f32> {
  let a = rb + 8u * i;
  return vec4<f32>(unpack2x16float(ld32(a)), unpack2x16float(ld32(a + 4u)));
}
//#endif
//#if bf16
fn bf2(w: u32) -> vec2<f32> { return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u)); }
fn load4(rb: u32, i: u32) -> vec4<f32> {
  let a = rb + 8u * i;
  return vec4<f32>(bf2(ld32(a)), bf2(ld32(a + 4u)));
}
//#endif

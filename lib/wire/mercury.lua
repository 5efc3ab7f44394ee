-- Wireshark dissector for the Mercury header (lib/wire/header.h; the field
-- reference is docs/wire-format.md).
--
-- Mercury rides on UDP: Ethernet | IPv4 | UDP | Mercury header (64 bytes,
-- big-endian fields) | payload. This dissector shows every header field by
-- name (type and dtype as names, flags as bits, sack in hex), the payload
-- and, for float32, bfloat16 and float16 payloads, the element count and the
-- first elements' values. It
-- applies the same validation rules as wire::decode(), in the same order,
-- and names the first rule a packet breaks with decode()'s reason code
-- (field mercury.reject, plus an expert-info error), so a capture shows
-- exactly what the receiver would have dropped and why.
--
-- Use:
--   tshark -X lua_script:lib/wire/mercury.lua -r capture.pcap -V
--   wireshark -X lua_script:lib/wire/mercury.lua capture.pcap
-- or copy this file into the personal Lua plugins folder
-- (~/.local/lib/wireshark/plugins/). It registers on UDP port 47100 (a
-- preference changes it), in "Decode As...", and as a heuristic dissector on
-- UDP so Mercury on other ports is recognised too.

local VERSION = 6
local HEADER_LEN = 64
-- The AuthBlock after the header of an authenticated packet (flag 0x0040).
local AUTH_LEN = 24
local DEFAULT_PORT = 47100
-- Elements shown one by one under the payload; the count is always shown.
local MAX_FLOATS_SHOWN = 32

local mercury = Proto("mercury", "Mercury parameter-server protocol")

local type_names = {
  [1] = "data",
  [2] = "agg_data",
  [3] = "ack",
  [4] = "control",
  [5] = "init",
  [6] = "partition_start",
}
local TYPE_ACK = 3
local TYPE_PARTITION_START = 6

local dtype_names = {
  [0] = "bytes",
  [1] = "float32",
  [2] = "bfloat16",
  [3] = "float16",
}
local DTYPE_FLOAT32 = 1
local DTYPE_BFLOAT16 = 2
local DTYPE_FLOAT16 = 3
-- Bytes per element of each dtype (header.h: decode's alignment rule).
local element_bytes = {[0] = 1, [1] = 4, [2] = 2, [3] = 2}

local FLAG_ACK_VALID = 0x0001
local FLAG_RETRANSMIT = 0x0002
local FLAG_ACK_REQUEST = 0x0004
local FLAG_SLICE = 0x0008
local FLAG_DUPLICATE = 0x0010
local FLAG_ANSWER = 0x0020
local FLAG_AUTH = 0x0040
local FLAGS_KNOWN = 0x007f

local f = mercury.fields
f.version = ProtoField.uint8("mercury.version", "Version", base.DEC)
f.type = ProtoField.uint8("mercury.type", "Type", base.DEC, type_names)
f.flags = ProtoField.uint16("mercury.flags", "Flags", base.HEX)
f.flag_ack_valid = ProtoField.bool("mercury.flags.ack_valid", "ACK valid", 16, nil,
  FLAG_ACK_VALID, "ack and sack carry an acknowledgement")
f.flag_retransmit = ProtoField.bool("mercury.flags.retransmit", "Retransmit", 16, nil,
  FLAG_RETRANSMIT, "a resend: no RTT sample is taken from it (Karn)")
f.flag_ack_request = ProtoField.bool("mercury.flags.ack_request", "ACK request", 16, nil,
  FLAG_ACK_REQUEST, "the receiver should acknowledge at once")
f.flag_slice = ProtoField.bool("mercury.flags.slice", "Slice", 16, nil,
  FLAG_SLICE, "one packet of a slice of a larger message: offset and msg_len are logical, no per-message byte counting")
f.flag_duplicate = ProtoField.bool("mercury.flags.duplicate", "Duplicate", 16, nil,
  FLAG_DUPLICATE, "the receiver got a packet and a resend of it since its last ACK: the resend was not needed")
f.flag_answer = ProtoField.bool("mercury.flags.answer", "Answer", 16, nil,
  FLAG_ANSWER, "a pure ACK answering a retransmission-timer probe: offset echoes the probe's token")
f.flag_auth = ProtoField.bool("mercury.flags.auth", "Authenticated", 16, nil,
  FLAG_AUTH, "an authentication block (counter, AES-GMAC tag) follows the header")
f.flag_unknown = ProtoField.uint16("mercury.flags.unknown", "Unknown flags", base.HEX, nil,
  0xff80)
f.auth_counter = ProtoField.uint64("mercury.auth.counter", "Auth counter", base.DEC, nil, nil,
  "the sender's packet counter towards this receiver (the MAC's nonce; replays are refused)")
f.auth_tag = ProtoField.bytes("mercury.auth.tag", "Auth tag", base.NONE,
  "AES-256-GMAC over the header, the counter and the payload")
f.job_id = ProtoField.uint32("mercury.job_id", "Job ID", base.DEC)
f.sender_id = ProtoField.uint16("mercury.sender_id", "Sender ID", base.DEC, nil, nil,
  "the sending node's index in the job file (not a worker rank)")
f.priority = ProtoField.uint8("mercury.priority", "Priority", base.DEC, nil, nil,
  "0 is the most urgent")
f.dtype = ProtoField.uint8("mercury.dtype", "Data type", base.DEC, dtype_names)
f.block_key = ProtoField.uint32("mercury.block_key", "Block key", base.DEC, nil, nil,
  "the block's index in the job's placement (a tensor is one or more blocks)")
f.msg_id = ProtoField.uint32("mercury.msg_id", "Message ID", base.DEC)
f.msg_len = ProtoField.uint32("mercury.msg_len", "Message length", base.DEC)
f.offset = ProtoField.uint32("mercury.offset", "Offset", base.DEC)
f.iteration = ProtoField.uint32("mercury.iteration", "Iteration", base.DEC, nil, nil,
  "a push (data, init): the parameter version its gradient was computed from; an " ..
  "asynchronous agg_data: bit 31 = it applied the recipient's gradient, bits 0-30 the " ..
  "chunk's slowest clock")
f.param_version = ProtoField.uint32("mercury.param_version", "Parameter version", base.DEC, nil,
  nil, "an aggregated chunk (agg_data): the version its update made; an asynchronous " ..
  "push (data): the worker's clock")
f.seq = ProtoField.uint32("mercury.seq", "Sequence number", base.DEC)
f.ack = ProtoField.uint32("mercury.ack", "Cumulative ACK", base.DEC)
f.payload_len = ProtoField.uint16("mercury.payload_len", "Payload length", base.DEC)
f.epoch = ProtoField.uint32("mercury.epoch", "Epoch", base.DEC, nil, nil,
  "the sender's incarnation: its start, in milliseconds of the wall clock mod 2^32")
f.sack = ProtoField.uint64("mercury.sack", "SACK", base.HEX, nil, nil,
  "bit i set: seq ack+1+i was received")
f.credit = ProtoField.uint16("mercury.credit", "Credit", base.DEC, nil, nil,
  "with ack_valid: sequence numbers from ack on the sender may have sent")
f.payload = ProtoField.bytes("mercury.payload", "Payload")
f.float_count = ProtoField.uint32("mercury.float_count", "Float32 elements", base.DEC)
f.float_value = ProtoField.float("mercury.float", "Element")
f.half_count = ProtoField.uint32("mercury.half_count", "Half-precision elements", base.DEC, nil,
  nil, "bfloat16 or float16 elements in the payload")
f.half_value = ProtoField.double("mercury.half", "Element", base.NONE,
  "a bfloat16 or float16 element's value (exact)")
f.reject = ProtoField.string("mercury.reject", "Rejected by decode")

local e = mercury.experts
e.malformed = ProtoExpert.new("mercury.malformed", "Malformed Mercury header",
  expert.group.MALFORMED, expert.severity.ERROR)

-- The validation of wire::decode(), rule by rule and in its order. Returns
-- decode()'s reason name for the first rule broken, or nil.
local function reject_reason(tvb)
  local len = tvb:len()
  if len < HEADER_LEN then return "truncated", "fewer than 64 bytes" end
  if tvb(0, 1):uint() ~= VERSION then return "bad_version", "version is not " .. VERSION end
  local ptype = tvb(1, 1):uint()
  if type_names[ptype] == nil then return "bad_type", "unknown packet type" end
  if bit.band(tvb(2, 2):uint(), bit.bnot(FLAGS_KNOWN)) ~= 0 then
    return "bad_flags", "unknown flag bits set"
  end
  local dtype = tvb(11, 1):uint()
  if dtype_names[dtype] == nil then return "bad_dtype", "unknown data type" end
  local payload_len = tvb(44, 2):uint()
  local extra = 0
  if bit.band(tvb(2, 2):uint(), FLAG_AUTH) ~= 0 then extra = AUTH_LEN end
  if len < HEADER_LEN + extra or payload_len ~= len - HEADER_LEN - extra then
    return "payload_mismatch", "payload_len disagrees with the bytes that follow"
  end
  if ptype == TYPE_ACK then
    if payload_len ~= 0 then return "ack_with_payload", "an ACK carries payload" end
  else
    if ptype == TYPE_PARTITION_START and payload_len ~= 0 then
      return "start_with_payload", "a partition start-up carries payload"
    end
    local msg_len = tvb(20, 4):uint()
    local offset = tvb(24, 4):uint()
    if offset + payload_len > msg_len then
      return "bad_range", "offset + payload_len runs past msg_len"
    end
    local size = element_bytes[dtype]
    if bit.band(bit.bor(offset, payload_len, msg_len), size - 1) ~= 0 then
      return "bad_alignment", dtype_names[dtype] .. " offset, length or message not a multiple of " ..
        size
    end
  end
  return nil
end

local function add_header(tree, tvb)
  tree:add(f.version, tvb(0, 1))
  tree:add(f.type, tvb(1, 1))
  local flags_item = tree:add(f.flags, tvb(2, 2))
  flags_item:add(f.flag_ack_valid, tvb(2, 2))
  flags_item:add(f.flag_retransmit, tvb(2, 2))
  flags_item:add(f.flag_ack_request, tvb(2, 2))
  flags_item:add(f.flag_slice, tvb(2, 2))
  flags_item:add(f.flag_duplicate, tvb(2, 2))
  flags_item:add(f.flag_answer, tvb(2, 2))
  flags_item:add(f.flag_auth, tvb(2, 2))
  if bit.band(tvb(2, 2):uint(), bit.bnot(FLAGS_KNOWN)) ~= 0 then
    flags_item:add(f.flag_unknown, tvb(2, 2))
  end
  tree:add(f.job_id, tvb(4, 4))
  tree:add(f.sender_id, tvb(8, 2))
  tree:add(f.priority, tvb(10, 1))
  tree:add(f.dtype, tvb(11, 1))
  tree:add(f.block_key, tvb(12, 4))
  tree:add(f.msg_id, tvb(16, 4))
  tree:add(f.msg_len, tvb(20, 4))
  tree:add(f.offset, tvb(24, 4))
  tree:add(f.iteration, tvb(28, 4))
  tree:add(f.param_version, tvb(32, 4))
  tree:add(f.seq, tvb(36, 4))
  tree:add(f.ack, tvb(40, 4))
  tree:add(f.payload_len, tvb(44, 2))
  tree:add(f.credit, tvb(46, 2))
  tree:add(f.sack, tvb(48, 8))
  tree:add(f.epoch, tvb(56, 4))
end

-- Where the payload starts: after the AuthBlock when there is one.
local function payload_start(tvb)
  if bit.band(tvb(2, 2):uint(), FLAG_AUTH) ~= 0 and tvb:len() >= HEADER_LEN + AUTH_LEN then
    return HEADER_LEN + AUTH_LEN
  end
  return HEADER_LEN
end

local function add_auth(tree, tvb)
  if payload_start(tvb) == HEADER_LEN then return end
  tree:add(f.auth_counter, tvb(HEADER_LEN, 8))
  tree:add(f.auth_tag, tvb(HEADER_LEN + 8, 16))
end

-- The value of a little-endian bfloat16 or float16 element: exact (every
-- one is a binary64 too). NaN payloads are not shown, only NaN.
local function half_value(dtype, bits)
  local negative = bit.band(bits, 0x8000) ~= 0
  local exp_bits, man_bits, bias = 8, 7, 127
  if dtype == DTYPE_FLOAT16 then exp_bits, man_bits, bias = 5, 10, 15 end
  local exp = bit.band(bit.rshift(bits, man_bits), bit.lshift(1, exp_bits) - 1)
  local man = bit.band(bits, bit.lshift(1, man_bits) - 1)
  local v
  if exp == bit.lshift(1, exp_bits) - 1 then
    if man ~= 0 then return 0 / 0 end
    v = math.huge
  elseif exp == 0 then
    v = man * 2 ^ (1 - bias - man_bits)
  else
    v = (bit.lshift(1, man_bits) + man) * 2 ^ (exp - bias - man_bits)
  end
  if negative then v = -v end
  return v
end

local function add_payload(tree, tvb)
  local start = payload_start(tvb)
  local bytes = tvb:len() - start
  if bytes <= 0 then return end
  local payload = tvb(start, bytes)
  local item = tree:add(f.payload, payload)
  local dtype = tvb(11, 1):uint()
  if dtype == DTYPE_BFLOAT16 or dtype == DTYPE_FLOAT16 then
    local count = math.floor(bytes / 2)
    item:add(f.half_count, payload, count):set_generated()
    -- Little-endian like float32 (dtype.h).
    for i = 0, math.min(count, MAX_FLOATS_SHOWN) - 1 do
      local element = tvb(start + 2 * i, 2)
      item:add(f.half_value, element, half_value(dtype, element:le_uint()))
    end
    if count > MAX_FLOATS_SHOWN then
      item:add(string.format("[%d more elements not shown]", count - MAX_FLOATS_SHOWN))
    end
  elseif dtype == DTYPE_FLOAT32 then
    local count = math.floor(bytes / 4)
    item:add(f.float_count, payload, count):set_generated()
    -- float32 elements are little-endian in the payload (header.h: Dtype).
    for i = 0, math.min(count, MAX_FLOATS_SHOWN) - 1 do
      item:add_le(f.float_value, tvb(start + 4 * i, 4))
    end
    if count > MAX_FLOATS_SHOWN then
      item:add(string.format("[%d more elements not shown]", count - MAX_FLOATS_SHOWN))
    end
  end
end

local function summary(tvb)
  local ptype = tvb(1, 1):uint()
  local flags = tvb(2, 2):uint()
  local s = string.format("%s seq=%u", type_names[ptype] or ("type " .. ptype),
    tvb(36, 4):uint())
  if bit.band(flags, FLAG_ACK_VALID) ~= 0 then s = s .. string.format(" ack=%u", tvb(40, 4):uint()) end
  if ptype ~= TYPE_ACK then
    s = s .. string.format(" key=%u off=%u len=%u", tvb(12, 4):uint(), tvb(24, 4):uint(),
      tvb(44, 2):uint())
  end
  if bit.band(flags, FLAG_RETRANSMIT) ~= 0 then s = s .. " [retransmit]" end
  if bit.band(flags, FLAG_SLICE) ~= 0 then s = s .. " [slice]" end
  if bit.band(flags, FLAG_AUTH) ~= 0 then s = s .. " [auth]" end
  return s
end

function mercury.dissector(tvb, pinfo, tree)
  pinfo.cols.protocol = "Mercury"
  local len = tvb:len()
  local shown = math.min(len, HEADER_LEN)
  local subtree = tree:add(mercury, tvb(0, shown))
  local reason, why = reject_reason(tvb)
  if len >= HEADER_LEN then
    add_header(subtree, tvb)
    add_auth(subtree, tvb)
    add_payload(subtree, tvb)
    pinfo.cols.info = summary(tvb)
  else
    pinfo.cols.info = "truncated Mercury header"
  end
  if reason ~= nil then
    subtree:add(f.reject, reason):set_generated()
    subtree:add_proto_expert_info(e.malformed, reason .. ": " .. why)
    pinfo.cols.info:append(" [rejected: " .. reason .. "]")
  end
  return len
end

-- Recognises Mercury on any UDP port: version 6, a known type, and a
-- payload_len that matches the datagram exactly (so unrelated traffic is
-- very unlikely to match).
local function heuristic(tvb, pinfo, tree)
  if tvb:len() < HEADER_LEN then return false end
  if tvb(0, 1):uint() ~= VERSION then return false end
  if type_names[tvb(1, 1):uint()] == nil then return false end
  if tvb(44, 2):uint() ~= tvb:len() - payload_start(tvb) then return false end
  mercury.dissector(tvb, pinfo, tree)
  return true
end

mercury.prefs.udp_port = Pref.uint("UDP port", DEFAULT_PORT,
  "UDP port decoded as Mercury (other ports are found by the heuristic)")

local udp_table = DissectorTable.get("udp.port")
local registered_port = DEFAULT_PORT
udp_table:add(registered_port, mercury)

function mercury.prefs_changed()
  if mercury.prefs.udp_port ~= registered_port then
    udp_table:remove(registered_port, mercury)
    registered_port = mercury.prefs.udp_port
    udp_table:add(registered_port, mercury)
  end
end

mercury:register_heuristic("udp", heuristic)

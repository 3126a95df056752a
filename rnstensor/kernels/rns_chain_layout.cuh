// The fused kernel's parameter layout (chain.cu): the int32 slots of the program header and of every op
// record, and the kernel's fixed sizes. The one definition of them: chain.cu includes this file and
// rnstensor/kernels/layout.py reads it (every "#define NAME value" here), so the host's packer
// (rnstensor.kernels.fused) writes the records the kernel reads.
#pragma once

// program header (int32 slots)
#define RC_NDIM 0      // logical tensor axes d
#define RC_STEPS 1     // ops (products, Hadamard products, drops)
#define RC_NIN 2       // entries per input tensor
#define RC_NOUT 3      // entries per output tensor
#define RC_NB 4        // tensors per block
#define RC_L0 5        // input planes
#define RC_BITS 6      // input encoding width
#define RC_CAP 7       // bytes per plane in each slot (multiple of 16)
#define RC_LMAX 8      // most planes at any step
#define RC_OPBYTES 9   // operator bytes (multiple of 16)
#define RC_ENC_F 10    // float offset of the encode tables: P, IP, H (L0 each), CP (3 x L0), pw (L0 x ldpw)
#define RC_ENC_LDPW 11
#define RC_ENC_I 12    // int offset of pa, per (L0 each)
#define RC_ENC_MAP 13  // int offset: (extent, physical stride) per logical input axis, then the batch stride
#define RC_DEC_MAP 14  // the same for the output
#define RC_DEC_BUF 15  // the slot holding the final planes
#define RC_DEC_I 16    // int offset of the decode tables (rns_decode_tables)
#define RC_DEC_F 17    // float offset
#define RC_NFIELD 18   // Hadamard field components per element
#define RC_NQ 19       // entries per field component
#define RC_NSLOTS 20   // tensor slots in shared memory
#define RC_OPS 21      // int offset of the first op record
// op record (int32 slots)
#define RS_KIND 0      // 0: product (sum of terms); 1: Hadamard product (sum of terms); 2: drop + extension
#define RS_SYNC 1      // 1: a block barrier after the op
#define RS_OUT 2       // the slot written
#define RS_IN 3        // drop: the slot read
#define RS_L 4         // planes
#define RS_RED 5       // float offset of P, IP, H (L each) of the planes
#define RS_M 6         // product rows: entries of an input / n_in, all tensors of the block
#define RS_W 7         // words per row: padded n_in / 4
#define RS_NOUT 8      // operator rows
#define RS_NLAST 9     // extent of the output's innermost axis (a drop: of its slot's innermost axis)
#define RS_NLASTPAD 10 // ... padded to a multiple of 4
#define RS_MT 11       // rows per tensor
#define RS_OSB 12      // output bytes per tensor and plane (the batch stride)
#define RS_NT 13       // terms (product, Hadamard)
#define RS_TERMS 14    // int offset of the terms: (input slot, operator byte offset or field component) each
#define RS_FPLANE 15   // Hadamard: int offset of the field plane of every plane
#define RS_MAP 16      // Hadamard: int offset of the layout's place map
#define RS_DROP_I 17   // drop: int offset of its packed tables (rns_drop_tables)
#define RS_DROP_F 18   // drop: float offset
#define RS_SLOTS 19    // drop: real entries per plane, all tensors of the block
#define RS_SIZE 20
#define RNS_TMAX 3          // terms of one Hadamard sum at most (3 * 2^14)
#define RNS_PRODUCT_TMAX 2  // terms of one product sum at most, for rows of <= 4 words (2 * 16 * 2^14)

#define RNS_CHAIN_THREADS 256

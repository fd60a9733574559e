// A C entry point around FlashInfer's own host launcher of chain speculative sampling
// (flashinfer/sampling.cuh, header-only), so that benchmarks/flashinfer_chain.py can call the
// kernel FlashInfer's `chain_speculative_sampling` launches through ctypes, without FlashInfer's
// Python package and JIT. Built on the GPU machine by the benchmark:
//   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -I <flashinfer include> chain.cu
#include <flashinfer/sampling.cuh>

extern "C" int flashinfer_chain_speculative_sampling(
    float* draft_probs,                  // [B, G, V]
    int* draft_token_ids,                // [B, G]
    float* target_probs,                 // [B, G+1, V]
    int* output_token_ids,               // [B, G+1]
    int* output_accepted_token_num,      // [B], incremented
    int* output_emitted_draft_token_num, // [B], incremented
    unsigned int batch_size, unsigned int num_speculative_tokens, unsigned int vocab_size,
    unsigned long long seed, unsigned long long offset, void* stream) {
  cudaError_t status = flashinfer::sampling::ChainSpeculativeSampling<float, int>(
      draft_probs, draft_token_ids, target_probs, output_token_ids, output_accepted_token_num,
      output_emitted_draft_token_num, batch_size, num_speculative_tokens, vocab_size,
      /*deterministic=*/true, /*seed_arr=*/nullptr, seed, /*offset_arr=*/nullptr, offset,
      static_cast<cudaStream_t>(stream));
  return static_cast<int>(status);
}

#include "scheduler/generator.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace kvd {

namespace {

struct ActiveSequence {
  size_t request = 0;
  SeqId id = 0;
  std::vector<int32_t> tokens;  // prompt + generated so far
  int32_t num_computed = 0;     // tokens whose K/V is in the cache
  std::optional<Sampler> sampler;
  bool done = false;
};

}  // namespace

Generator::Generator(LlamaModel* model, KvCacheManager* cache, GeneratorOptions options)
    : model_(model), cache_(cache), options_(options) {}

absl::StatusOr<std::vector<GenerationResult>> Generator::Run(
    absl::Span<const GenerationRequest> requests, const TokenCallback& on_token) {
  const ModelSpec& spec = model_->spec();
  std::vector<GenerationResult> results(requests.size());
  std::vector<ActiveSequence> seqs;
  seqs.reserve(requests.size());

  // Frees every sequence still holding blocks, on success and on error alike.
  auto release_all = [&] {
    for (ActiveSequence& s : seqs) {
      if (!s.done) cache_->Free(s.id);
      s.done = true;
    }
  };

  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    if (r.prompt.empty()) {
      release_all();
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": empty prompt"));
    }
    if (static_cast<int32_t>(r.prompt.size()) > spec.max_context_tokens) {
      release_all();
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": prompt of ",
                                                     r.prompt.size(), " tokens exceeds the ",
                                                     spec.max_context_tokens,
                                                     "-token context"));
    }
    for (int32_t t : r.prompt) {
      if (t < 0 || t >= spec.vocab_size) {
        release_all();
        return absl::InvalidArgumentError(absl::StrCat("request ", i, ": token id ", t,
                                                       " outside the vocabulary [0, ",
                                                       spec.vocab_size, ")"));
      }
    }
    if (auto s = r.sampling.Validate(); !s.ok()) {
      release_all();
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", s.message()));
    }
    ActiveSequence seq;
    seq.request = i;
    seq.id = next_seq_id_++;
    seq.tokens = r.prompt;
    seq.sampler.emplace(r.sampling);
    if (r.max_new_tokens <= 0) {
      seq.done = true;
      seqs.push_back(std::move(seq));
      continue;
    }
    auto cached = cache_->AddSequence(seq.id, r.prompt, r.session_id);
    if (!cached.ok()) {
      release_all();
      return cached.status();
    }
    seq.num_computed = *cached;
    results[i].cached_prompt_tokens = *cached;
    results[i].computed_prompt_tokens = static_cast<int32_t>(r.prompt.size()) - *cached;
    seqs.push_back(std::move(seq));
  }

  const int32_t block_size = cache_->block_size();
  std::vector<KvCacheView> views(spec.num_layers);
  std::vector<float> logits;
  while (true) {
    // Plan: each unfinished sequence, oldest first, gets its next chunk under the budgets.
    ForwardBatch batch;
    std::vector<std::pair<ActiveSequence*, int32_t>> planned;  // (sequence, tokens fed)
    int32_t budget = options_.max_num_batched_tokens;
    for (ActiveSequence& s : seqs) {
      if (s.done) continue;
      if (budget == 0 || static_cast<int32_t>(planned.size()) == options_.max_batch_size) break;
      const int32_t pending = static_cast<int32_t>(s.tokens.size()) - s.num_computed;
      const int32_t n = std::min(pending, budget);
      if (!cache_->Reserve(s.id, n)) {
        release_all();
        return absl::ResourceExhaustedError(absl::StrCat(
            "KV pool exhausted: cannot reserve ", n, " more tokens for request ", s.request,
            "; use a larger pool or fewer concurrent requests"));
      }
      batch.AddSequence(absl::MakeConstSpan(s.tokens).subspan(s.num_computed, n),
                        s.num_computed, cache_->BlockIds(s.id), block_size,
                        /*want_logits=*/n == pending);
      planned.emplace_back(&s, n);
      budget -= n;
    }
    if (planned.empty()) break;

    for (int32_t l = 0; l < spec.num_layers; ++l) views[l] = cache_->LayerView(l);
    if (auto s = model_->Forward(batch, views, &logits); !s.ok()) {
      release_all();
      return s;
    }
    ++num_steps_;

    // Commit: advance computed counts, sample where the chunk reached the end.
    size_t logit_row = 0;
    for (auto& [s, n] : planned) {
      cache_->MarkComputed(s->id, n);
      s->num_computed += n;
      if (s->num_computed < static_cast<int32_t>(s->tokens.size())) continue;
      const GenerationRequest& r = requests[s->request];
      GenerationResult& result = results[s->request];
      const int32_t token = s->sampler->Sample(absl::MakeConstSpan(
          logits.data() + logit_row++ * spec.vocab_size, spec.vocab_size));
      if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
          r.stop_token_ids.end()) {
        result.finish = FinishReason::kStop;
        s->done = true;
      } else {
        result.output.push_back(token);
        s->tokens.push_back(token);
        cache_->AppendTokens(s->id, {token});
        if (on_token) on_token(s->request, token);
        if (static_cast<int32_t>(result.output.size()) >= r.max_new_tokens) {
          result.finish = FinishReason::kLength;
          s->done = true;
        } else if (static_cast<int32_t>(s->tokens.size()) > spec.max_context_tokens) {
          // The new token would sit at position max_context_tokens: nothing can attend it.
          result.finish = FinishReason::kContextLimit;
          s->done = true;
        }
      }
      if (s->done) cache_->Free(s->id);
    }
    cache_->Tick();
  }
  return results;
}

}  // namespace kvd

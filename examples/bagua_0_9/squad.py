"""Bagua 0.9.2's SQuAD example (BERT fine-tuned for extractive question
answering), on CPU: SQuAD v1.1 JSON files, ``BertForQuestionAnswering`` from
``transformers``, exact match and F1 as SQuAD's evaluation computes them,
and the original's flags for the training loop. With no network, the model
is built from a ``BertConfig`` (``--hidden_size``, ``--num_hidden_layers``...;
bert-large's are 1024 and 24) and the WordPiece vocabulary is written from
the training file's words when ``--vocab_file`` is not given. Run it with:

    python -m bagua.distributed.launch --nproc_per_node 2 examples/bagua_0_9/squad.py \\
        --train_file train.json --predict_file dev.json --do_train --do_eval --algorithm qadam
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import string

import torch
from transformers import BertConfig, BertForQuestionAnswering, BertTokenizerFast

import bagua.torch_api as bagua

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def read_squad(path):
    """(id, question, context, answer text, answer start) of every question."""
    with open(path) as f:
        data = json.load(f)["data"]
    out = []
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answer = qa["answers"][0] if qa["answers"] else {"text": "", "answer_start": -1}
                out.append((qa["id"], qa["question"], paragraph["context"], answer["text"], answer["answer_start"]))
    return out


def write_vocab(examples, path):
    words = set()
    for _, q, c, _, _ in examples:
        words.update(re.findall(r"\w+|[^\w\s]", (q + " " + c).lower()))
    with open(path, "w") as f:
        f.write("\n".join(SPECIAL + sorted(words)) + "\n")


def features(tokenizer, examples, args, train):
    """Windows of question + context (stride --doc_stride); in training the
    answer's first and last token, or [CLS] when the window lacks it."""
    enc = tokenizer(
        [e[1] for e in examples],
        [e[2] for e in examples],
        truncation="only_second",
        max_length=args.max_seq_length,
        stride=args.doc_stride,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
        padding="max_length",
    )
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        ex = examples[enc["overflow_to_sample_mapping"][i]]
        seq = enc.sequence_ids(i)
        first = seq.index(1)
        last = len(seq) - 1 - seq[::-1].index(1)
        a, b = ex[4], ex[4] + len(ex[3])
        if train and offsets[first][0] <= a and offsets[last][1] >= b:
            s = first
            while s <= last and offsets[s][1] <= a:
                s += 1
            e = last
            while e >= first and offsets[e][0] >= b:
                e -= 1
            starts.append(s)
            ends.append(e)
        else:
            starts.append(0)
            ends.append(0)
        if not train:  # keep only the context's offsets, for mapping predictions back
            enc["offset_mapping"][i] = [o if seq[k] == 1 else None for k, o in enumerate(offsets)]
    return enc, starts, ends


def normalize(text):
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1(prediction, truth):
    p, t = normalize(prediction).split(), normalize(truth).split()
    common = sum((collections.Counter(p) & collections.Counter(t)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p), common / len(t)
    return 2 * precision * recall / (precision + recall)


def evaluate(model, tokenizer, examples, args):
    enc, _, _ = features(tokenizer, examples, args, train=False)
    model.eval()
    best = {}
    with torch.no_grad():
        for i in range(0, len(enc["input_ids"]), args.per_gpu_eval_batch_size):
            sl = slice(i, i + args.per_gpu_eval_batch_size)
            out = model(
                input_ids=torch.tensor(enc["input_ids"][sl]),
                attention_mask=torch.tensor(enc["attention_mask"][sl]),
                token_type_ids=torch.tensor(enc["token_type_ids"][sl]),
            )
            for j, (start, end) in enumerate(zip(out.start_logits, out.end_logits)):
                f = i + j
                offsets, ex = enc["offset_mapping"][f], examples[enc["overflow_to_sample_mapping"][f]]
                top_s = torch.topk(start, min(20, start.numel())).indices.tolist()
                top_e = torch.topk(end, min(20, end.numel())).indices.tolist()
                for s in top_s:
                    for e in top_e:
                        if offsets[s] is None or offsets[e] is None or e < s or e - s + 1 > args.max_answer_length:
                            continue
                        score = float(start[s] + end[e])
                        if ex[0] not in best or score > best[ex[0]][0]:
                            best[ex[0]] = (score, ex[2][offsets[s][0] : offsets[e][1]])
    exact = sum(normalize(best.get(ex[0], (0, ""))[1]) == normalize(ex[3]) for ex in examples)
    f1_sum = sum(f1(best.get(ex[0], (0, ""))[1], ex[3]) for ex in examples)
    return {"exact": 100.0 * exact / len(examples), "f1": 100.0 * f1_sum / len(examples)}


def main():
    parser = argparse.ArgumentParser(description="SQuAD fine-tuning with Bagua (CPU)")
    parser.add_argument("--train_file", default="")
    parser.add_argument("--predict_file", default="")
    parser.add_argument("--output_dir", default="", help="where rank 0 saves the model")
    parser.add_argument("--vocab_file", default="", help="default: written from the training file's words")
    parser.add_argument("--do_train", action="store_true")
    parser.add_argument("--do_eval", action="store_true")
    parser.add_argument("--do_lower_case", action="store_true", default=True)
    parser.add_argument("--max_seq_length", default=128, type=int, help="the original's is 384")
    parser.add_argument("--doc_stride", default=32, type=int)
    parser.add_argument("--max_answer_length", default=30, type=int)
    parser.add_argument("--per_gpu_train_batch_size", default=8, type=int)
    parser.add_argument("--per_gpu_eval_batch_size", default=16, type=int)
    parser.add_argument("--learning_rate", default=1e-3, type=float)
    parser.add_argument("--weight_decay", default=0.0, type=float)
    parser.add_argument("--num_train_epochs", default=2, type=int)
    parser.add_argument("--logging_steps", default=5, type=int)
    parser.add_argument("--seed", default=42, type=int)
    parser.add_argument("--hidden_size", default=64, type=int)
    parser.add_argument("--num_hidden_layers", default=2, type=int)
    parser.add_argument("--num_attention_heads", default=4, type=int)
    parser.add_argument("--intermediate_size", default=128, type=int)
    parser.add_argument("--algorithm", default="gradient_allreduce", help="a Bagua algorithm; qadam as the original's")
    parser.add_argument("--warmup_steps", default=20, type=int, help="QAdam's warm-up")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    bagua.init_process_group()
    rank = bagua.get_rank()
    train_examples = read_squad(args.train_file) if args.train_file else []
    eval_examples = read_squad(args.predict_file) if args.predict_file else []
    vocab = args.vocab_file or os.path.join(args.output_dir or ".", "vocab.txt")
    if not args.vocab_file:
        if bagua.get_local_rank() == 0:
            os.makedirs(os.path.dirname(os.path.abspath(vocab)), exist_ok=True)
            write_vocab(train_examples + eval_examples, vocab)
        bagua.barrier()
    tokenizer = BertTokenizerFast(vocab_file=vocab, do_lower_case=args.do_lower_case)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.num_hidden_layers,
        num_attention_heads=args.num_attention_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=max(512, args.max_seq_length),
    )
    model = BertForQuestionAnswering(config)
    if args.algorithm == "qadam":
        from bagua.torch_api.algorithms import q_adam

        optimizer = q_adam.QAdamOptimizer(
            model.parameters(), lr=args.learning_rate, warmup_steps=args.warmup_steps, weight_decay=args.weight_decay
        )
        algorithm = q_adam.QAdamAlgorithm(optimizer)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
        algorithm = bagua.algorithms.Algorithm.init(args.algorithm)
    model = model.with_bagua([optimizer], algorithm)

    if args.do_train:
        enc, starts, ends = features(tokenizer, train_examples, args, train=True)
        data = torch.utils.data.TensorDataset(
            torch.tensor(enc["input_ids"]),
            torch.tensor(enc["attention_mask"]),
            torch.tensor(enc["token_type_ids"]),
            torch.tensor(starts),
            torch.tensor(ends),
        )
        sampler = torch.utils.data.distributed.DistributedSampler(data, seed=args.seed)
        loader = torch.utils.data.DataLoader(data, batch_size=args.per_gpu_train_batch_size, sampler=sampler)
        step = 0
        for epoch in range(args.num_train_epochs):
            sampler.set_epoch(epoch)
            model.train()
            for ids, mask, types, s, e in loader:
                loss = model(
                    input_ids=ids, attention_mask=mask, token_type_ids=types, start_positions=s, end_positions=e
                ).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                step += 1
                if step % args.logging_steps == 0 and rank == 0:
                    print(f"step {step} epoch {epoch} loss {loss.item():.4f}", flush=True)
        if args.output_dir and rank == 0:
            model.save_pretrained(args.output_dir)
            tokenizer.save_pretrained(args.output_dir)
    if args.do_eval and rank == 0:
        print("Results: " + json.dumps(evaluate(model, tokenizer, eval_examples, args)), flush=True)
    bagua.barrier()


if __name__ == "__main__":
    main()

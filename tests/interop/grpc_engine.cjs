// A gRPC client of the engines in Node (tests/test_interop.py): @grpc/grpc-js with the stubs that ts-proto
// generated from protos/conduit/v1/engine.proto at test time (`stubs`: their compiled module). Prints what it got as
// JSON on stdout, for the Python test to check.
// Usage: node grpc_engine.cjs '{"stubs", "embeddingAddress", "chatAddress", "texts", "prompt", "maxTokens"}'
const grpc = require("@grpc/grpc-js");

function unary(client, method, request) {
  return new Promise((resolve, reject) => {
    const deadline = Date.now() + 120_000;
    client[method](request, { deadline }, (error, answer) => (error ? reject(error) : resolve(answer)));
  });
}

function streamed(client, request) {
  return new Promise((resolve, reject) => {
    const messages = [];
    const call = client.generate(request, { deadline: Date.now() + 120_000 });
    call.on("data", (message) => messages.push(message));
    call.on("error", reject);
    call.on("end", () => resolve(messages));
  });
}

function failure(error) {
  return { code: error.code, codeName: grpc.status[error.code], details: error.details,
           param: error.metadata.get("conduit-param")[0] ?? null };
}

async function main() {
  const { stubs, embeddingAddress, chatAddress, texts, prompt, maxTokens } = JSON.parse(process.argv[2]);
  const { EngineClient, EmbedRequest, GenerateRequest, finishReasonToJSON } = require(stubs);
  const embedder = new EngineClient(embeddingAddress, grpc.credentials.createInsecure());
  const chat = new EngineClient(chatAddress, grpc.credentials.createInsecure());

  // ts-proto's messages are whole objects (its encoders skip only default values): fromPartial fills the rest.
  const request = EmbedRequest.fromPartial({ inputs: texts.map((text) => ({ text })) });
  const embedded = await unary(embedder, "embed", request);
  let refused = null;
  try {
    await unary(embedder, "embed", EmbedRequest.fromPartial({ inputs: [{ text: "fine" }, { text: "" }] }));
  } catch (error) {
    refused = failure(error);
  }
  const messages = await streamed(chat, GenerateRequest.fromPartial({
    chat: { messages: [{ role: "user", content: prompt }] }, sampling: { temperature: 0 }, stopping: { maxTokens },
  }));
  const chunks = messages.filter((m) => m.chunk).map((m) => m.chunk.text);
  const final = messages.find((m) => m.final)?.final;
  console.log(JSON.stringify({
    embed: { vectors: embedded.embeddings.map((e) => Array.from(e.values)),
             promptTokens: embedded.embeddings.map((e) => e.promptTokens), total: embedded.promptTokens,
             model: embedded.model },
    refused,
    generate: { chunks, finishReason: final ? finishReasonToJSON(final.finishReason) : null,
                completionTokens: final?.completionTokens ?? null },
  }));
  embedder.close();
  chat.close();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

// The openai SDK for Node against Conduit's shim (tests/test_interop.py): prints what it got as JSON
// on stdout, for the Python test to check.
// Usage: node openai_sdk.cjs '{"baseURL", "embeddingModel", "chatModel", "texts"}'
const OpenAI = require("openai");

async function main() {
  const { baseURL, embeddingModel, chatModel, texts } = JSON.parse(process.argv[2]);
  const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });
  // No encoding_format: the SDK asks for base64 and decodes it into numbers itself.
  const byDefault = await client.embeddings.create({ model: embeddingModel, input: texts });
  const asFloat = await client.embeddings.create({ model: embeddingModel, input: texts, encoding_format: "float" });
  const single = await client.embeddings.create({ model: embeddingModel, input: texts[0] });
  let refused = null;
  try {
    await client.embeddings.create({ model: embeddingModel, input: ["fine", ""] });
  } catch (error) {
    refused = { badRequest: error instanceof OpenAI.BadRequestError, status: error.status, param: error.param,
                type: error.type, message: error.message };
  }
  const chat = await client.chat.completions.create({
    model: chatModel, messages: [{ role: "user", content: "Say hello." }], max_tokens: 5,
  });
  const vectors = (answer) => answer.data.map((item) => item.embedding);
  console.log(JSON.stringify({
    default: { vectors: vectors(byDefault), indexes: byDefault.data.map((item) => item.index),
               model: byDefault.model, usage: byDefault.usage },
    float: { vectors: vectors(asFloat) },
    single: { vectors: vectors(single) },
    refused,
    chat: { content: chat.choices[0].message.content, finishReason: chat.choices[0].finish_reason,
            usage: chat.usage },
  }));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});

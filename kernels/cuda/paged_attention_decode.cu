// Placeholder for the GQA-shared split-KV decode kernel (issue 17).

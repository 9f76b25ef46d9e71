// Swagger UI for /docs (api/docs.py): a file of its own, so the page runs no inline script
// and its Content-Security-Policy can forbid any (api/headers.py). The key given to
// "Authorize" lives in this page only: it is not kept in the browser's storage.
window.ui = SwaggerUIBundle({
  url: document.body.dataset.openapi,
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
});
